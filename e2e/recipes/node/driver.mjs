// Runs the recipes for e2e/recipes_node_test.go, one process per test: it
// reads one JSON request a line from stdin,
//
//   {"seq": 1, "variant": "openai", "orderId": "42", "text": "...", "deadline": "250ms"}
//
// runs each as it arrives (concurrently, as an application would), and
// writes one JSON line per request to stdout when it ends: {"seq": 1, ...}
// with the fields every client's driver reports. It calls llmgate at
// $LLMGATE_BASE_URL (the OpenAI clients) and $LLMGATE_ANTHROPIC_BASE_URL
// (the Anthropic SDK) with the client key $LLMGATE_API_KEY.
//
// variant is a recipe as written (openai, langchain, anthropic for
// messages.create, anthropic-stream for messages.stream and its
// finalMessage()) or what the recipes warn against: openai-idempotencykey
// and anthropic-idempotencykey (the SDK's idempotencyKey option instead of
// the header), langchain-retries-N (LangChain's retries left at N, the key
// passed the same way). anthropic-batches creates a message batch of three
// requests (custom_ids orderId-1..3, text as the prompt), retrieves it, and
// reads its results with batches.results(), which fetches the batch's
// absolute results_url: content is the custom_ids it read, in order,
// comma-separated; raw holds the batch as created and as retrieved.
//
// The streaming and Responses calls: openai-stream, openai-response,
// openai-response-stream (recipe_openai.mjs), langchain-stream and
// langchain-response (recipe_langchain.mjs), and langchain-stream-options,
// what that recipe warns against (`.stream()` with the key in the call's
// options.headers). A stream reports its id, the text its deltas
// assemble, and raw: its chunks or events as the client decoded them.
import { createInterface } from "node:readline";
import OpenAI from "openai";
import { ChatOpenAI } from "@langchain/openai";
import * as openaiRecipe from "./recipe_openai.mjs";
import * as langchainRecipe from "./recipe_langchain.mjs";
import * as anthropicRecipe from "./recipe_anthropic.mjs";

const baseURL = process.env.LLMGATE_BASE_URL;
const apiKey = process.env.LLMGATE_API_KEY;

const client = openaiRecipe.newClient(baseURL, apiKey);
const model = langchainRecipe.newModel(baseURL, apiKey);
const anthropicBaseURL = process.env.LLMGATE_ANTHROPIC_BASE_URL;
const anthropic = anthropicBaseURL ? anthropicRecipe.newClient(anthropicBaseURL, apiKey) : null;

function completion(data, response) {
  const content = data.choices[0]?.message?.content ?? "";
  return { ok: true, id: data.id, content, raw: JSON.stringify(data), replayed: response.headers.get("idempotent-replayed") ?? "" };
}

function message(msg) {
  const raw = JSON.stringify({ id: msg.id, content: msg.content, usage: msg.usage_metadata });
  return { ok: true, id: msg.id, content: msg.content, raw };
}

// anthropicMessage is what the Anthropic SDK returned: the message's text
// blocks joined, and the message as the SDK holds it.
function anthropicMessage(msg, response) {
  const content = msg.content.filter((b) => b.type === "text").map((b) => b.text).join("");
  return { ok: true, id: msg.id, content, raw: JSON.stringify(msg), replayed: response?.headers.get("idempotent-replayed") ?? "" };
}

// anthropicBatch runs a message batch through the SDK's batches API:
// create, retrieve, and the results read whole.
async function anthropicBatch(orderId, text) {
  const requests = [1, 2, 3].map((i) => ({
    custom_id: `${orderId}-${i}`,
    params: { model: "claude-sonnet-4-5", max_tokens: 256, messages: [{ role: "user", content: `Summarize: ${text}` }] },
  }));
  const created = await anthropic.messages.batches.create({ requests });
  const retrieved = await anthropic.messages.batches.retrieve(created.id);
  const ids = [];
  for await (const r of await anthropic.messages.batches.results(created.id)) {
    ids.push(r.custom_id);
  }
  return { ok: true, id: created.id, content: ids.join(","), raw: JSON.stringify({ created, retrieved }) };
}

async function runAnthropic({ variant, orderId, text }) {
  if (variant === "anthropic-batches") {
    return anthropicBatch(orderId, text);
  }
  if (variant === "anthropic") {
    const { data, response } = await anthropicRecipe.summarize(anthropic, orderId, text).withResponse();
    return anthropicMessage(data, response);
  }
  if (variant === "anthropic-stream") {
    const stream = anthropicRecipe.summarizeStream(anthropic, orderId, text);
    const msg = await stream.finalMessage();
    return anthropicMessage(msg, stream.response);
  }
  if (variant === "anthropic-idempotencykey") {
    const params = { model: "claude-sonnet-4-5", max_tokens: 256, messages: [{ role: "user", content: `Summarize: ${text}` }] };
    const { data, response } = await anthropic.messages
      .create(params, { idempotencyKey: anthropicRecipe.key(orderId) })
      .withResponse();
    return anthropicMessage(data, response);
  }
  throw new Error(`unknown variant ${variant}`);
}

// chunks reads a stream to its end: the id and text part of each item by
// part, the items (as keep holds them) as JSON.
async function chunks(stream, part, keep = (item) => item) {
  let id = "";
  let content = "";
  const items = [];
  for await (const item of stream) {
    const [itemId, delta] = part(item);
    id ||= itemId ?? "";
    content += delta ?? "";
    items.push(keep(item));
  }
  return { ok: true, id, content, raw: JSON.stringify(items) };
}

const chatPart = (c) => [c.id, c.choices[0]?.delta?.content];
const responsePart = (e) => [e.response?.id, e.type === "response.output_text.delta" ? e.delta : ""];
const langchainPart = (c) => [c.id, typeof c.content === "string" ? c.content : ""];
const langchainItem = (c) => ({ id: c.id, content: c.content, usage: c.usage_metadata });

async function runStream({ variant, orderId, text }) {
  const replayed = (response) => response.headers.get("idempotent-replayed") ?? "";
  if (variant === "openai-stream") {
    const { data, response } = await openaiRecipe.summarizeStream(client, orderId, text).withResponse();
    return { ...(await chunks(data, chatPart)), replayed: replayed(response) };
  }
  if (variant === "openai-response") {
    const { data, response } = await openaiRecipe.summarizeResponse(client, orderId, text).withResponse();
    return { ok: true, id: data.id, content: data.output_text, raw: JSON.stringify(data), replayed: replayed(response) };
  }
  if (variant === "openai-response-stream") {
    const { data, response } = await openaiRecipe.summarizeResponseStream(client, orderId, text).withResponse();
    return { ...(await chunks(data, responsePart)), replayed: replayed(response) };
  }
  if (variant === "langchain-stream") {
    return chunks(await langchainRecipe.summarizeStream(baseURL, apiKey, orderId, text), langchainPart, langchainItem);
  }
  if (variant === "langchain-stream-options") {
    const headers = { "Idempotency-Key": `order-${orderId}/summarize-stream` };
    const stream = await model.stream([{ role: "user", content: `Summarize: ${text}` }], { options: { headers } });
    return chunks(stream, langchainPart, langchainItem);
  }
  if (variant === "langchain-response") {
    const msg = await langchainRecipe.summarizeResponse(baseURL, apiKey, orderId, text);
    return { ...message(msg), content: msg.text };
  }
  throw new Error(`unknown variant ${variant}`);
}

async function run({ variant, orderId, text, deadline }) {
  if (variant?.startsWith("anthropic")) {
    return runAnthropic({ variant, orderId, text });
  }
  if (/-(stream|response|response-stream|stream-options)$/.test(variant ?? "")) {
    return runStream({ variant, orderId, text });
  }
  const extra = deadline ? { "X-Llmgate-Deadline": deadline } : {};
  if (variant === "openai") {
    const { data, response } = await openaiRecipe.summarize(client, orderId, text, { headers: extra }).withResponse();
    return completion(data, response);
  }
  if (variant === "openai-idempotencykey") {
    const { data, response } = await new OpenAI({ baseURL, apiKey }).chat.completions
      .create(
        { model: "gpt-4o-mini", messages: [{ role: "user", content: `Summarize: ${text}` }] },
        { idempotencyKey: `order-${orderId}/summarize`, headers: extra },
      )
      .withResponse();
    return completion(data, response);
  }
  if (variant === "langchain") {
    return message(await langchainRecipe.summarize(model, orderId, text, extra));
  }
  const m = /^langchain-retries-(\d+)$/.exec(variant ?? "");
  if (m) {
    const retrying = new ChatOpenAI({ model: "gpt-4o-mini", apiKey, maxRetries: Number(m[1]), configuration: { baseURL } });
    const headers = { ...extra, "Idempotency-Key": `order-${orderId}/summarize` };
    return message(await retrying.invoke([{ role: "user", content: `Summarize: ${text}` }], { options: { headers } }));
  }
  throw new Error(`unknown variant ${variant}`);
}

async function handle(line) {
  const req = JSON.parse(line);
  const start = Date.now();
  let out;
  try {
    out = await run(req);
  } catch (err) {
    // type is an Anthropic.APIError's error.type.
    out = { ok: false, status: err?.status ?? 0, code: err?.code ?? "", type: err?.type ?? "", message: String(err?.message ?? err) };
  }
  process.stdout.write(JSON.stringify({ seq: req.seq, ...out, ms: Date.now() - start }) + "\n");
}

for await (const line of createInterface({ input: process.stdin })) {
  if (line.trim() !== "") handle(line);
}
