// The official Node SDKs (`openai`, `@anthropic-ai/sdk`), unmodified, pointed at meshfast.
//
// Environment: MESHFAST_BASE_URL (http://host:port), MESHFAST_KEY, and comma-separated model
// lists MESHFAST_CHAT_MODELS (plain chat) and MESHFAST_TOOLS_MODELS (models that answer with a
// tool call), paired by position. For each pair and each SDK it runs a non-streaming and a
// streaming chat and a tool call (streamed and not), then prints one JSON object:
// {"<chat model>": {"openai_chat": {...}, "openai_responses": {...}, "anthropic": {...}}}.
// A failing call is recorded as {"error": "..."} so the caller sees every result at once.

import Anthropic from "@anthropic-ai/sdk";
import OpenAI from "openai";

const base = process.env.MESHFAST_BASE_URL;
const key = process.env.MESHFAST_KEY;
const chatModels = (process.env.MESHFAST_CHAT_MODELS || "").split(",").filter(Boolean);
const toolsModels = (process.env.MESHFAST_TOOLS_MODELS || "").split(",").filter(Boolean);
if (!base || !key || chatModels.length === 0 || chatModels.length !== toolsModels.length) {
  console.error("set MESHFAST_BASE_URL, MESHFAST_KEY and as many MESHFAST_TOOLS_MODELS as MESHFAST_CHAT_MODELS");
  process.exit(2);
}

const openai = new OpenAI({ baseURL: `${base}/v1`, apiKey: key, maxRetries: 0 });
const anthropic = new Anthropic({ baseURL: base, apiKey: key, maxRetries: 0 });

const schema = {
  type: "object",
  properties: { city: { type: "string" }, unit: { type: "string" } },
  required: ["city"],
};
const question = "What is the weather in Paris?";

async function attempt(fn) {
  try {
    return await fn();
  } catch (err) {
    return { error: `${err?.constructor?.name}: ${err?.message}` };
  }
}

async function openaiChat(model, toolsModel) {
  const messages = [
    { role: "system", content: "be brief" },
    { role: "user", content: "hello" },
  ];
  const plain = await attempt(async () => {
    const r = await openai.chat.completions.create({ model, messages, max_tokens: 50 });
    return { text: r.choices[0].message.content, finish: r.choices[0].finish_reason, usage: r.usage };
  });
  const stream = await attempt(async () => {
    const s = await openai.chat.completions.create({
      model, messages, max_tokens: 50, stream: true, stream_options: { include_usage: true },
    });
    let text = "";
    let usage = null;
    let finish = null;
    for await (const chunk of s) {
      if (chunk.choices.length) {
        text += chunk.choices[0].delta.content ?? "";
        finish = chunk.choices[0].finish_reason ?? finish;
      }
      usage = chunk.usage ?? usage;
    }
    return { text, finish, usage };
  });
  const tools = [{ type: "function", function: { name: "get_weather", parameters: schema } }];
  const tool = await attempt(async () => {
    const r = await openai.chat.completions.create({
      model: toolsModel, messages: [{ role: "user", content: question }], tools,
    });
    const call = r.choices[0].message.tool_calls[0];
    return { finish: r.choices[0].finish_reason, name: call.function.name, arguments: JSON.parse(call.function.arguments) };
  });
  const toolStream = await attempt(async () => {
    const s = await openai.chat.completions.create({
      model: toolsModel, messages: [{ role: "user", content: question }], tools, stream: true,
    });
    let name = "";
    let args = "";
    let finish = null;
    for await (const chunk of s) {
      if (!chunk.choices.length) continue;
      for (const d of chunk.choices[0].delta.tool_calls ?? []) {
        name = name || (d.function?.name ?? "");
        args += d.function?.arguments ?? "";
      }
      finish = chunk.choices[0].finish_reason ?? finish;
    }
    return { finish, name, arguments: JSON.parse(args) };
  });
  return { plain, stream, tool, tool_stream: toolStream };
}

async function openaiResponses(model, toolsModel) {
  const plain = await attempt(async () => {
    const r = await openai.responses.create({ model, input: "hello", instructions: "be brief", max_output_tokens: 50 });
    return { text: r.output_text, usage: r.usage };
  });
  const stream = await attempt(async () => {
    const s = await openai.responses.create({ model, input: "hello", max_output_tokens: 50, stream: true });
    let text = "";
    let usage = null;
    for await (const event of s) {
      if (event.type === "response.output_text.delta") text += event.delta;
      if (event.type === "response.completed") usage = event.response.usage;
    }
    return { text, usage };
  });
  const tool = await attempt(async () => {
    const r = await openai.responses.create({
      model: toolsModel, input: question, tools: [{ type: "function", name: "get_weather", parameters: schema, strict: false }],
    });
    const call = r.output.find((o) => o.type === "function_call");
    return { name: call.name, arguments: JSON.parse(call.arguments) };
  });
  return { plain, stream, tool };
}

async function anthropicMessages(model, toolsModel) {
  const messages = [{ role: "user", content: "hello" }];
  const plain = await attempt(async () => {
    const m = await anthropic.messages.create({ model, max_tokens: 50, system: "be brief", messages });
    return {
      text: m.content.filter((b) => b.type === "text").map((b) => b.text).join(""),
      stop: m.stop_reason,
      usage: m.usage,
    };
  });
  const stream = await attempt(async () => {
    const s = anthropic.messages.stream({ model, max_tokens: 50, messages });
    let text = "";
    s.on("text", (delta) => {
      text += delta;
    });
    const final = await s.finalMessage();
    return { text, stop: final.stop_reason, usage: final.usage };
  });
  const tools = [{ name: "get_weather", input_schema: schema }];
  const tool = await attempt(async () => {
    const m = await anthropic.messages.create({
      model: toolsModel, max_tokens: 100, messages: [{ role: "user", content: question }], tools,
    });
    const use = m.content.find((b) => b.type === "tool_use");
    return { stop: m.stop_reason, name: use.name, arguments: use.input };
  });
  const toolStream = await attempt(async () => {
    const s = anthropic.messages.stream({
      model: toolsModel, max_tokens: 100, messages: [{ role: "user", content: question }], tools,
    });
    const final = await s.finalMessage();
    const use = final.content.find((b) => b.type === "tool_use");
    return { stop: final.stop_reason, name: use.name, arguments: use.input };
  });
  return { plain, stream, tool, tool_stream: toolStream };
}

const results = {};
for (let i = 0; i < chatModels.length; i++) {
  const [model, toolsModel] = [chatModels[i], toolsModels[i]];
  results[model] = {
    openai_chat: await openaiChat(model, toolsModel),
    openai_responses: await openaiResponses(model, toolsModel),
    anthropic: await anthropicMessages(model, toolsModel),
  };
}
console.log(JSON.stringify(results));
