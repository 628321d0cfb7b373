// The AI SDK as an app uses it (an OpenAI-compatible provider, streamText, smoothStream), for a
// plain page: bundled by scripts/build-test-clients into ../vendor/ai-sdk.min.js.
import { streamText, smoothStream } from "ai";
import { createOpenAICompatible } from "@ai-sdk/openai-compatible";
window.aiSdk = { streamText, smoothStream, createOpenAICompatible };
