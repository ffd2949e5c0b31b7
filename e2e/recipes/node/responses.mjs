// llmgate's Responses API snippet for the official Node SDK (npm "openai"):
// the README's "Responses API" Node example, run as written by
// TestResponsesNodeSnippet (e2e/responses_sdk_test.go) against the gateway.
// Pass the Idempotency-Key in `headers` (the SDK's own idempotencyKey
// option sends no header).
import OpenAI from "openai";

const client = new OpenAI({
  baseURL: process.env.LLMGATE_URL ?? "http://127.0.0.1:8080/v1",
  apiKey: process.env.LLMGATE_KEY ?? "demo",
});

const key = "order-42/summarize";
const response = await client.responses.create(
  { model: "gpt-4o-mini", input: "Summarize order 42" },
  { headers: { "Idempotency-Key": key } },
);
console.log(response.id, response.output_text);

// The same key and body again: llmgate's replay, the same response.
const again = await client.responses
  .create({ model: "gpt-4o-mini", input: "Summarize order 42" }, { headers: { "Idempotency-Key": key } })
  .withResponse();
console.log(again.data.id === response.id, again.response.headers.get("idempotent-replayed"));

// Streamed: typed events, under a key of its own.
const stream = await client.responses.create(
  { model: "gpt-4o-mini", input: "Stream order 42", stream: true },
  { headers: { "Idempotency-Key": "order-42/stream" } },
);
for await (const event of stream) {
  if (event.type === "response.output_text.delta") process.stdout.write(event.delta);
  if (event.type === "response.completed") console.log("\n" + event.response.status);
}
