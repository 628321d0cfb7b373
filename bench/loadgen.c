/* The bench's load generator in C: the same upstream and client as bench/upstream.py and
 * bench/client.py (same request, events, output), at a fraction of their CPU per event.
 *
 *   loadgen upstream --listen 127.0.0.1:0       prints {"port": N, "uvloop": false} when ready
 *   loadgen load --target HOST:PORT --streams N --rate R --events E --mode paced|lockstep
 *                --warmup-s W --measure-s M --grace-s G        prints {"result": {...}}
 *
 * Why it exists: on a 2-core machine the Python generator needs ~0.5 of a core at 20,000
 * events/s, so it cannot load two proxy workers to saturation next to itself. This one is a
 * single-threaded epoll loop per role; bench/run.py --scale builds it with `cc -O2` and uses it.
 * The method is the Python one: every token event is one HTTP/1.1 chunk whose JSON starts
 * {"t":<CLOCK_REALTIME ns read just before the write>,"l":<µs late against its schedule>,...;
 * the client takes the kernel's receive stamp (SO_TIMESTAMPNS) of the read that brought it.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define MAX_CONN 4096
#define BUF_CAP (256 * 1024)

static int64_t now_ns(clockid_t clock) {
    struct timespec ts;
    clock_gettime(clock, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static void die(const char *what) {
    perror(what);
    exit(1);
}

static void nonblock(int fd) { fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK); }

static void split_hostport(const char *spec, struct sockaddr_in *addr) {
    char host[64];
    const char *colon = strrchr(spec, ':');
    if (!colon || (size_t)(colon - spec) >= sizeof host) {
        fprintf(stderr, "loadgen: %s is not HOST:PORT\n", spec);
        exit(2);
    }
    memcpy(host, spec, colon - spec);
    host[colon - spec] = 0;
    memset(addr, 0, sizeof *addr);
    addr->sin_family = AF_INET;
    addr->sin_port = htons((uint16_t)atoi(colon + 1));
    if (inet_pton(AF_INET, host, &addr->sin_addr) != 1) {
        fprintf(stderr, "loadgen: %s is not an IPv4 address\n", host);
        exit(2);
    }
}

/* -- upstream ---------------------------------------------------------------------------- */

static const char HEAD[] =
    "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncache-control: no-cache\r\n"
    "x-accel-buffering: no\r\ntransfer-encoding: chunked\r\n\r\n";
static const char EVENT[] =
    "data: {\"t\":%lld,\"l\":%lld,\"id\":\"chatcmpl-bench\",\"object\":\"chat.completion.chunk\","
    "\"created\":1700000000,\"model\":\"bench\",\"choices\":[{\"index\":0,\"delta\":{\"content\":"
    "\" tok\"},\"finish_reason\":null}]}\n\n";
static const char FINISH[] =
    "data: {\"id\":\"chatcmpl-bench\",\"object\":\"chat.completion.chunk\",\"created\":1700000000,"
    "\"model\":\"bench\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n";
static const char DONE[] = "data: [DONE]\n\n";

typedef struct {
    int fd;
    int streaming;      /* 0: reading a request; 1: sending events */
    char in[8192];
    size_t in_len;
    long n, sent;       /* events to send, sent so far */
    double period_s;    /* 0: all at once */
    int64_t next_ns;    /* CLOCK_MONOTONIC time of the next event */
    char *out;          /* bytes the socket did not take yet */
    size_t out_len, out_cap;
} Up;

static Up *ups[MAX_CONN];
static int up_epoll;

static void up_close(Up *u) {
    epoll_ctl(up_epoll, EPOLL_CTL_DEL, u->fd, NULL);
    close(u->fd);
    ups[u->fd] = NULL;
    free(u->out);
    free(u);
}

/* Write what is queued, then `data`; keep what the socket does not take. 0 on a dead peer. */
static int up_send(Up *u, const char *data, size_t len) {
    if (u->out_len == 0) {
        ssize_t w = send(u->fd, data, len, MSG_NOSIGNAL);
        if (w < 0 && errno != EAGAIN) return 0;
        if (w < 0) w = 0;
        data += w;
        len -= (size_t)w;
        if (len == 0) return 1;
    }
    if (u->out_len + len > u->out_cap) {
        u->out_cap = (u->out_len + len) * 2;
        u->out = realloc(u->out, u->out_cap);
    }
    memcpy(u->out + u->out_len, data, len);
    u->out_len += len;
    struct epoll_event ev = {.events = EPOLLIN | EPOLLOUT, .data.fd = u->fd};
    epoll_ctl(up_epoll, EPOLL_CTL_MOD, u->fd, &ev);
    return 1;
}

static int up_chunk(Up *u, const char *payload, size_t len) {
    char buf[1024];
    int head = snprintf(buf, sizeof buf, "%zx\r\n", len);
    memcpy(buf + head, payload, len);
    memcpy(buf + head + len, "\r\n", 2);
    return up_send(u, buf, head + len + 2);
}

static double header_value(const char *req, const char *key, double fallback) {
    const char *p = strcasestr(req, "x-bench:");
    if (!p) return fallback;
    const char *end = strstr(p, "\r\n");
    const char *k = strstr(p, key);
    if (!k || (end && k > end)) return fallback;
    return atof(k + strlen(key));
}

static void up_request(Up *u) {
    u->in[u->in_len] = 0;
    char *end = strstr(u->in, "\r\n\r\n");
    if (!end) return;
    const char *cl = strcasestr(u->in, "content-length:");
    size_t body = cl && cl < end ? (size_t)atol(cl + 15) : 0;
    size_t need = (size_t)(end + 4 - u->in) + body;
    if (u->in_len < need) return;
    u->n = (long)header_value(u->in, "n=", 10);
    double rate = header_value(u->in, "rate=", 50);
    const char *mode = strstr(u->in, "mode=lockstep");
    memmove(u->in, u->in + need, u->in_len - need);
    u->in_len -= need;
    u->sent = 0;
    u->streaming = 1;
    u->period_s = rate > 0 ? 1.0 / rate : 0;
    int64_t now = now_ns(CLOCK_MONOTONIC);
    if (u->period_s == 0) {
        u->next_ns = now;
    } else if (mode) { /* the next tick of one shared clock */
        int64_t p = (int64_t)(u->period_s * 1e9);
        u->next_ns = (now / p + 1) * p;
    } else { /* its own clock, random phase */
        u->next_ns = now + (int64_t)(drand48() * u->period_s * 1e9);
    }
    up_send(u, HEAD, sizeof HEAD - 1);
}

static void up_event(Up *u, int64_t now_mono) {
    char payload[512];
    int64_t late_us = (now_mono - u->next_ns) / 1000;
    int len = snprintf(payload, sizeof payload, EVENT, (long long)now_ns(CLOCK_REALTIME),
                       (long long)(late_us > 0 ? late_us : 0));
    if (!up_chunk(u, payload, (size_t)len)) {
        up_close(u);
        return;
    }
    u->sent++;
    u->next_ns += (int64_t)(u->period_s * 1e9);
    if (u->sent >= u->n) {
        up_chunk(u, FINISH, sizeof FINISH - 1);
        up_chunk(u, DONE, sizeof DONE - 1);
        up_send(u, "0\r\n\r\n", 5);
        u->streaming = 0;
    }
}

static int run_upstream(const char *listen_spec) {
    struct sockaddr_in addr;
    split_hostport(listen_spec, &addr);
    int ls = socket(AF_INET, SOCK_STREAM, 0);
    int one = 1;
    setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(ls, (struct sockaddr *)&addr, sizeof addr) || listen(ls, 1024)) die("listen");
    socklen_t alen = sizeof addr;
    getsockname(ls, (struct sockaddr *)&addr, &alen);
    nonblock(ls);
    up_epoll = epoll_create1(0);
    struct epoll_event ev = {.events = EPOLLIN, .data.fd = ls};
    epoll_ctl(up_epoll, EPOLL_CTL_ADD, ls, &ev);
    printf("{\"port\": %d, \"uvloop\": false, \"generator\": \"c\"}\n", ntohs(addr.sin_port));
    fflush(stdout);
    srand48(now_ns(CLOCK_MONOTONIC));
    struct epoll_event events[256];
    for (;;) {
        /* sleep until the earliest due event (a scan: a few hundred streams at most) */
        int64_t now = now_ns(CLOCK_MONOTONIC), due = now + 100000000;
        for (int fd = 0; fd < MAX_CONN; fd++)
            if (ups[fd] && ups[fd]->streaming && ups[fd]->next_ns < due) due = ups[fd]->next_ns;
        /* epoll waits whole milliseconds (rounded up): an event can be sent up to 1 ms after
           its time, as asyncio's timers are; "l" says by how much, and delay is measured from
           the actual send */
        int timeout_ms = due > now ? (int)((due - now + 999999) / 1000000) : 0;
        int n = epoll_wait(up_epoll, events, 256, timeout_ms);
        for (int i = 0; i < n; i++) {
            int fd = events[i].data.fd;
            if (fd == ls) {
                int c;
                while ((c = accept4(ls, NULL, NULL, SOCK_NONBLOCK)) >= 0) {
                    if (c >= MAX_CONN) {
                        close(c);
                        continue;
                    }
                    setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
                    Up *u = calloc(1, sizeof *u);
                    u->fd = c;
                    ups[c] = u;
                    struct epoll_event cev = {.events = EPOLLIN, .data.fd = c};
                    epoll_ctl(up_epoll, EPOLL_CTL_ADD, c, &cev);
                }
                continue;
            }
            Up *u = ups[fd];
            if (!u) continue;
            if (events[i].events & EPOLLOUT && u->out_len) {
                ssize_t w = send(fd, u->out, u->out_len, MSG_NOSIGNAL);
                if (w > 0) {
                    memmove(u->out, u->out + w, u->out_len - (size_t)w);
                    u->out_len -= (size_t)w;
                }
                if (u->out_len == 0) {
                    struct epoll_event cev = {.events = EPOLLIN, .data.fd = fd};
                    epoll_ctl(up_epoll, EPOLL_CTL_MOD, fd, &cev);
                }
            }
            if (events[i].events & (EPOLLIN | EPOLLHUP | EPOLLERR)) {
                ssize_t r = recv(fd, u->in + u->in_len, sizeof u->in - 1 - u->in_len, 0);
                if (r == 0 || (r < 0 && errno != EAGAIN)) {
                    up_close(u);
                    continue;
                }
                if (r > 0) {
                    u->in_len += (size_t)r;
                    if (!u->streaming) up_request(u);
                }
            }
        }
        now = now_ns(CLOCK_MONOTONIC);
        for (int fd = 0; fd < MAX_CONN; fd++) {
            Up *u = ups[fd];
            while (u && ups[fd] == u && u->streaming && u->next_ns <= now) up_event(u, now);
        }
    }
    return 0;
}

/* -- client ------------------------------------------------------------------------------ */

typedef struct {
    int fd;
    int done;           /* 0 running; else the outcome index */
    int headers_done, status;
    long received;
    char *buf;
    size_t len;
} Cl;

enum { RUNNING, OK, SHORT, EOF_, TIMEOUT, CONNECT, RECV, HTTP, N_OUTCOMES };
static const char *OUTCOME[] = {"running", "ok", "short", "eof", "timeout", "connect", "recv", "http"};

typedef struct {
    int64_t *v;
    size_t n, cap;
} Vec;

static void push(Vec *v, int64_t x) {
    if (v->n == v->cap) {
        v->cap = v->cap ? v->cap * 2 : 65536;
        v->v = realloc(v->v, v->cap * sizeof *v->v);
    }
    v->v[v->n++] = x;
}

static int cmp64(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

static void print_pct(const char *name, Vec *v, double scale) {
    if (v->n == 0) {
        printf("\"%s\": {\"p50\": null, \"p99\": null, \"max\": null, \"n\": 0}", name);
        return;
    }
    qsort(v->v, v->n, sizeof *v->v, cmp64);
    size_t n = v->n;
    size_t r50 = (size_t)fmax(0, fmin(n - 1, (long)(0.50 * n + 0.5) - 1));
    size_t r99 = (size_t)fmax(0, fmin(n - 1, (long)(0.99 * n + 0.5) - 1));
    printf("\"%s\": {\"p50\": %.6f, \"p99\": %.6f, \"max\": %.6f, \"n\": %zu}", name,
           v->v[r50] * scale, v->v[r99] * scale, v->v[n - 1] * scale, n);
}

static Vec kernel_d, user_d, late_d;
static long events_total;
static int64_t win_lo, win_hi;
static long expected_per_stream;

static const char MARK[] = "{\"t\":";
static const char TERMINATOR[] = "\r\n0\r\n\r\n";

/* Take the events in c->buf; keep an unfinished tail. */
static void cl_take(Cl *c, int64_t kernel, int64_t user) {
    char *b = c->buf;
    size_t start = 0;
    if (!c->headers_done) {
        char *end = memmem(b, c->len, "\r\n\r\n", 4);
        if (!end) return;
        c->status = atoi(b + 9);
        c->headers_done = 1;
        start = (size_t)(end + 2 - b); /* keep "\r\n": a body of only "0\r\n\r\n" still matches */
    }
    size_t keep = c->len > sizeof TERMINATOR - 1 ? c->len - (sizeof TERMINATOR - 1) : 0;
    if (keep < start) keep = start;
    char *p = memmem(b + start, c->len - start, MARK, 5);
    while (p) {
        char *comma = memchr(p + 5, ',', b + c->len - (p + 5));
        char *comma2 = comma ? memchr(comma + 1, ',', b + c->len - (comma + 1)) : NULL;
        if (!comma2) {
            keep = (size_t)(p - b);
            break;
        }
        int64_t sent = strtoll(p + 5, NULL, 10);
        int64_t late = strtoll(comma + 5, NULL, 10);
        c->received++;
        events_total++;
        if (win_lo <= sent && sent < win_hi) {
            push(&kernel_d, kernel - sent);
            push(&user_d, user - sent);
            push(&late_d, late);
        }
        p = memmem(comma2, b + c->len - comma2, MARK, 5);
    }
    if (memmem(b + start, c->len - start, TERMINATOR, sizeof TERMINATOR - 1)) {
        c->done = c->received >= expected_per_stream ? OK : SHORT;
        return;
    }
    memmove(b, b + keep, c->len - keep);
    c->len -= keep;
}

static void enable_timestamps(void) {
    /* Linux turns packet timestamps on through deferred work: ask early, then wait */
    int s = socket(AF_INET, SOCK_STREAM, 0), one = 1;
    setsockopt(s, SOL_SOCKET, SO_TIMESTAMPNS, &one, sizeof one);
    struct timespec pause = {0, 200000000};
    nanosleep(&pause, NULL);
    close(s);
}

static int run_load(const char *target, int streams, double rate, long events, const char *mode,
                    double warmup_s, double measure_s, double grace_s) {
    struct sockaddr_in addr;
    split_hostport(target, &addr);
    expected_per_stream = events;
    enable_timestamps();
    int64_t t0 = now_ns(CLOCK_REALTIME);
    win_lo = t0 + (int64_t)(warmup_s * 1e9);
    win_hi = t0 + (int64_t)((warmup_s + measure_s) * 1e9);
    char body[] = "{\"model\":\"bench\",\"stream\":true,\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}";
    char req[1024];
    int req_len = snprintf(req, sizeof req,
                           "POST /v1/chat/completions HTTP/1.1\r\nhost: %s\r\ncontent-type: "
                           "application/json\r\naccept: text/event-stream\r\nx-bench: "
                           "n=%ld;rate=%g;mode=%s\r\ncontent-length: %zu\r\n\r\n%s",
                           target, events, rate, mode, strlen(body), body);
    int ep = epoll_create1(0);
    Cl *cls = calloc((size_t)streams, sizeof *cls);
    int64_t started = now_ns(CLOCK_MONOTONIC);
    int one = 1;
    for (int i = 0; i < streams; i++) {
        Cl *c = &cls[i];
        if (i && i % 64 == 0) {
            /* in waves, as clients arrive: a listener's accept queue (asyncio's default backlog
               is 100) that overflows drops SYNs, which come back a whole second later */
            struct timespec pause = {0, 50000000};
            nanosleep(&pause, NULL);
        }
        c->buf = malloc(BUF_CAP);
        c->fd = socket(AF_INET, SOCK_STREAM, 0);
        setsockopt(c->fd, SOL_SOCKET, SO_TIMESTAMPNS, &one, sizeof one);
        setsockopt(c->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        /* blocking connect and send, as clients arrive; then non-blocking reads */
        if (connect(c->fd, (struct sockaddr *)&addr, sizeof addr) ||
            send(c->fd, req, (size_t)req_len, MSG_NOSIGNAL) != req_len) {
            c->done = CONNECT;
            close(c->fd);
            continue;
        }
        nonblock(c->fd);
        struct epoll_event ev = {.events = EPOLLIN, .data.u32 = (uint32_t)i};
        epoll_ctl(ep, EPOLL_CTL_ADD, c->fd, &ev);
    }
    double connect_s = (now_ns(CLOCK_MONOTONIC) - started) / 1e9;
    double planned_s = rate > 0 ? events / rate : 0;
    int64_t deadline = started + (int64_t)((planned_s + grace_s) * 1e9);
    if (deadline < now_ns(CLOCK_MONOTONIC)) deadline = now_ns(CLOCK_MONOTONIC);
    int running = 0;
    for (int i = 0; i < streams; i++) running += cls[i].done == RUNNING;
    struct epoll_event evs[256];
    char control[CMSG_SPACE(sizeof(struct timespec)) * 2];
    while (running > 0) {
        int64_t left = deadline - now_ns(CLOCK_MONOTONIC);
        if (left <= 0) break;
        int n = epoll_wait(ep, evs, 256, (int)(left / 1000000) + 1);
        for (int k = 0; k < n; k++) {
            Cl *c = &cls[evs[k].data.u32];
            if (c->done) continue;
            if (c->len == BUF_CAP) { /* a line this long is not a bench event */
                c->done = RECV;
            } else {
                struct iovec iov = {c->buf + c->len, BUF_CAP - c->len};
                struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = control,
                                     .msg_controllen = sizeof control};
                ssize_t r = recvmsg(c->fd, &msg, 0);
                if (r < 0 && errno == EAGAIN) continue;
                int64_t user = now_ns(CLOCK_REALTIME), kernel = user;
                for (struct cmsghdr *cm = CMSG_FIRSTHDR(&msg); cm; cm = CMSG_NXTHDR(&msg, cm))
                    if (cm->cmsg_level == SOL_SOCKET && cm->cmsg_type == SCM_TIMESTAMPNS) {
                        struct timespec ts;
                        memcpy(&ts, CMSG_DATA(cm), sizeof ts);
                        kernel = (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
                    }
                if (r < 0) {
                    c->done = RECV;
                } else if (r == 0) {
                    c->done = c->received < events ? EOF_ : OK;
                } else {
                    c->len += (size_t)r;
                    cl_take(c, kernel, user);
                }
            }
            if (c->done) {
                if (c->status && c->status != 200) c->done = HTTP;
                epoll_ctl(ep, EPOLL_CTL_DEL, c->fd, NULL);
                close(c->fd);
                running--;
            }
        }
    }
    long outcomes[N_OUTCOMES] = {0};
    int timed_out = 0;
    for (int i = 0; i < streams; i++) {
        if (cls[i].done == RUNNING) {
            cls[i].done = TIMEOUT;
            timed_out++;
            close(cls[i].fd);
        }
        outcomes[cls[i].done]++;
    }
    double elapsed_s = (now_ns(CLOCK_MONOTONIC) - started) / 1e9;
    printf("{\"result\": {\"streams\": %d, \"rate\": %g, \"mode\": \"%s\", \"events_per_stream\": "
           "%ld, \"events_received\": %ld, \"events_expected\": %ld, \"events_measured\": %zu, "
           "\"outcomes\": {",
           streams, rate, mode, events, events_total, events * streams, kernel_d.n);
    const char *sep = "";
    for (int o = 1; o < N_OUTCOMES; o++)
        if (outcomes[o]) {
            printf("%s\"%s\": %ld", sep, OUTCOME[o], outcomes[o]);
            sep = ", ";
        }
    printf("}, \"timed_out\": %d, \"connect_s\": %.3f, \"elapsed_s\": %.3f, \"generator\": \"c\", ",
           timed_out, connect_s, elapsed_s);
    print_pct("delay_ms", &kernel_d, 1e-6);
    printf(", ");
    print_pct("delay_user_ms", &user_d, 1e-6);
    printf(", ");
    print_pct("upstream_late_ms", &late_d, 1e-3);
    printf("}}\n");
    return 0;
}

static const char *arg(int argc, char **argv, const char *name, const char *fallback) {
    for (int i = 2; i + 1 < argc; i++)
        if (!strcmp(argv[i], name)) return argv[i + 1];
    return fallback;
}

int main(int argc, char **argv) {
    if (argc >= 2 && !strcmp(argv[1], "upstream"))
        return run_upstream(arg(argc, argv, "--listen", "127.0.0.1:0"));
    if (argc >= 2 && !strcmp(argv[1], "load"))
        return run_load(arg(argc, argv, "--target", "127.0.0.1:8080"),
                        atoi(arg(argc, argv, "--streams", "1")),
                        atof(arg(argc, argv, "--rate", "50")),
                        atol(arg(argc, argv, "--events", "300")),
                        arg(argc, argv, "--mode", "paced"),
                        atof(arg(argc, argv, "--warmup-s", "1.5")),
                        atof(arg(argc, argv, "--measure-s", "5")),
                        atof(arg(argc, argv, "--grace-s", "3")));
    fprintf(stderr, "usage: loadgen upstream --listen HOST:PORT | loadgen load --target HOST:PORT ...\n");
    return 2;
}
