// llmgate's recipe for the official Node SDK (npm "openai"): a base URL and
// an Idempotency-Key per call. The README's "Node (openai)" section is this
// file; e2e/recipes_node_test.go runs it against the real gateway.
import OpenAI from "openai";

// Leave the SDK's retries on (maxRetries: 2 by default): it retries exactly
// when llmgate answers x-should-retry: true — a 409 idempotency_key_in_flight,
// a 504 client_deadline_exceeded — after Retry-After, resending the same
// headers and so the same key. Every other failure llmgate has already
// retried, or it is permanent; it says x-should-retry: false, and the SDK
// throws at once.
export function newClient(baseURL, apiKey) {
  return new OpenAI({ baseURL, apiKey });
}

// The key goes in `headers`. Not the `idempotencyKey` request option: the
// SDK accepts it but sends no header for it (the OpenAI client names no
// idempotency header), so it deduplicates nothing.
export function summarize(client, orderId, text, options = {}) {
  return client.chat.completions.create(
    { model: "gpt-4o-mini", messages: [{ role: "user", content: `Summarize: ${text}` }] },
    { ...options, headers: { ...options.headers, "Idempotency-Key": `order-${orderId}/summarize` } },
  );
}

// The same call streamed, under a key of its own (the same key with another
// body is a 422). `for await (const chunk of stream)` reads the chunks; the
// same order streamed twice is one upstream call, and the second stream is
// the first, byte for byte, from llmgate's store. A stream that fails
// mid-way ends in an error event, so the loop throws, and is not committed.
export function summarizeStream(client, orderId, text, options = {}) {
  return client.chat.completions.create(
    { model: "gpt-4o-mini", messages: [{ role: "user", content: `Summarize: ${text}` }], stream: true },
    { ...options, headers: { ...options.headers, "Idempotency-Key": `order-${orderId}/summarize-stream` } },
  );
}

// The Responses API, keyed the same way; a replay is the same response (id).
export function summarizeResponse(client, orderId, text, options = {}) {
  return client.responses.create(
    { model: "gpt-4o-mini", input: `Summarize: ${text}` },
    { ...options, headers: { ...options.headers, "Idempotency-Key": `order-${orderId}/summarize-response` } },
  );
}

// The Responses API streamed: typed events (response.output_text.delta,
// response.completed), replayed byte for byte under the key.
export function summarizeResponseStream(client, orderId, text, options = {}) {
  return client.responses.create(
    { model: "gpt-4o-mini", input: `Summarize: ${text}`, stream: true },
    { ...options, headers: { ...options.headers, "Idempotency-Key": `order-${orderId}/summarize-response-stream` } },
  );
}
