// llmgate's recipe for LangChain.js (@langchain/openai): a base URL, an
// Idempotency-Key per call, and retries only where llmgate says so. The
// README's "LangChain.js" section is this file; e2e/recipes_node_test.go
// runs it against the real gateway.
import { ChatOpenAI } from "@langchain/openai";

// maxRetries: 0 turns LangChain's own retries off. They ignore
// x-should-retry: they re-send 5xx and 422 answers llmgate has already
// retried or refused (each re-send of a failure is a new round of upstream
// attempts), and they never retry a 409. LangChain creates its OpenAI
// client with maxRetries: 0, so nothing else retries either.
export function newModel(baseURL, apiKey) {
  return new ChatOpenAI({ model: "gpt-4o-mini", apiKey, maxRetries: 0, configuration: { baseURL } });
}

// summarize retries, with the same key, exactly when llmgate answers
// x-should-retry: true (a 409 idempotency_key_in_flight, a 504
// client_deadline_exceeded), after Retry-After; at most 3 tries. Any other
// error is thrown as the OpenAI SDK raised it (err.status, err.code).
export async function summarize(model, orderId, text, headers = {}) {
  const options = { headers: { ...headers, "Idempotency-Key": `order-${orderId}/summarize` } };
  for (let attempt = 1; ; attempt++) {
    try {
      return await model.invoke([{ role: "user", content: `Summarize: ${text}` }], { options });
    } catch (err) {
      if (err?.headers?.get?.("x-should-retry") !== "true" || attempt === 3) throw err;
      const seconds = Number(err.headers.get("retry-after")) || 0;
      await new Promise((resolve) => setTimeout(resolve, seconds * 1000));
    }
  }
}

// keyedModel is newModel with the key in configuration.defaultHeaders: a
// model for one call. That is how a key reaches `.stream()`: its per-call
// `{ options: { headers } }` sends no Idempotency-Key (measured: two
// upstream calls, two different streams, TestRecipeLangChainJSStreamOptions),
// while `invoke` with the same option does. useResponsesApi: true sends the
// call to the Responses API instead.
export function keyedModel(baseURL, apiKey, key, fields = {}) {
  return new ChatOpenAI({
    model: "gpt-4o-mini", apiKey, maxRetries: 0, ...fields,
    configuration: { baseURL, defaultHeaders: { "Idempotency-Key": key } },
  });
}

// summarizeStream streams the summary under order-<id>/summarize-stream:
// `for await (const chunk of await summarizeStream(...))` reads the
// AIMessageChunks. The same order streamed twice is one upstream call and
// the same chunks. It does not retry: a 409 (x-should-retry: true, a
// first call with the key not answering yet) is thrown as err.status 409;
// call again with the same key. A duplicate of a stream that is already
// answering joins it, with no 409.
export function summarizeStream(baseURL, apiKey, orderId, text) {
  return keyedModel(baseURL, apiKey, `order-${orderId}/summarize-stream`)
    .stream([{ role: "user", content: `Summarize: ${text}` }]);
}

// summarizeResponse asks the Responses API (useResponsesApi: true) under
// order-<id>/summarize-response.
export function summarizeResponse(baseURL, apiKey, orderId, text) {
  return keyedModel(baseURL, apiKey, `order-${orderId}/summarize-response`, { useResponsesApi: true })
    .invoke([{ role: "user", content: `Summarize: ${text}` }]);
}
