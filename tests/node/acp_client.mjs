// An editor written with the official TypeScript ACP SDK (an implementation independent of mibyan's):
// it starts `mibyan acp`, runs the prompts the test scripted, and prints what it saw as one JSON line.
//
//   node acp_client.mjs PROJECT_DIR -- COMMAND ARGS...
//
// Prompts: "two rounds" (tools, then the answer), "reject" (a permission it rejects), "cancel" (it
// cancels once the answer starts streaming), then session/load of the same session, then "budget" (more
// tool rounds than --max-turns allows).
import { spawn } from "node:child_process";
import { Readable, Writable } from "node:stream";
import * as acp from "@agentclientprotocol/sdk";

const [project, separator, command, ...args] = process.argv.slice(2);
if (separator !== "--" || !command) {
  process.stderr.write("usage: node acp_client.mjs PROJECT_DIR -- COMMAND ARGS...\n");
  process.exit(2);
}

const child = spawn(command, args, { stdio: ["pipe", "pipe", "inherit"] });
const stream = acp.ndJsonStream(Writable.toWeb(child.stdin), Readable.toWeb(child.stdout));

let updates = [];
let waiters = [];
const permissions = [];

function tag(update) {
  const status = update.status ? `:${update.status}` : "";
  return update.sessionUpdate.startsWith("tool_call") ? update.sessionUpdate + status : update.sessionUpdate;
}

function waitFor(condition) {
  return new Promise((resolve) => {
    if (condition()) resolve();
    else waiters.push({ condition, resolve });
  });
}

const editor = acp
  .client({ name: "acp-sdk-test-client" })
  .onNotification(acp.methods.client.session.update, ({ params }) => {
    updates.push(params.update);
    waiters = waiters.filter((w) => (w.condition() ? (w.resolve(), false) : true));
  })
  .onRequest(acp.methods.client.session.requestPermission, ({ params }) => {
    permissions.push(params.toolCall.toolCallId);
    const reject = params.options.find((option) => option.kind === "reject_once");
    return { outcome: { outcome: "selected", optionId: reject.optionId } };
  });

function taken() {
  const seen = updates;
  updates = [];
  return seen;
}

const report = await editor.connectWith(stream, async (agent) => {
  const init = await agent.request(acp.methods.agent.initialize, {
    protocolVersion: acp.PROTOCOL_VERSION,
    clientCapabilities: {},
  });
  const { sessionId } = await agent.request(acp.methods.agent.session.new, { cwd: project, mcpServers: [] });
  const say = (text) =>
    agent.request(acp.methods.agent.session.prompt, { sessionId, prompt: [{ type: "text", text }] });

  const first = await say("two rounds");
  const firstUpdates = taken();
  const rejected = await say("reject");
  const rejectUpdates = taken();

  const cancelled = say("cancel");
  await waitFor(() => updates.some((u) => u.sessionUpdate === "agent_message_chunk"));
  const cancelSent = performance.now();
  await agent.notify(acp.methods.agent.session.cancel, { sessionId });
  const cancelStop = (await cancelled).stopReason;
  const cancelMs = performance.now() - cancelSent;
  taken();

  await agent.request(acp.methods.agent.session.load, { sessionId, cwd: project, mcpServers: [] });
  const replay = taken();
  const budget = await say("budget");
  return {
    loadSession: init.agentCapabilities.loadSession,
    sessionId,
    first: { stopReason: first.stopReason, tags: firstUpdates.map(tag) },
    answer: firstUpdates
      .filter((u) => u.sessionUpdate === "agent_message_chunk")
      .map((u) => u.content.text)
      .join(""),
    kinds: firstUpdates.filter((u) => u.sessionUpdate === "tool_call").map((u) => u.kind),
    rejected: { stopReason: rejected.stopReason, tags: rejectUpdates.map(tag) },
    permissions,
    rejectCallIds: rejectUpdates.filter((u) => u.sessionUpdate === "tool_call").map((u) => u.toolCallId),
    cancel: { stopReason: cancelStop, ms: cancelMs },
    budget: budget.stopReason,
    replay: replay.map(tag),
    replayedUserText: replay.filter((u) => u.sessionUpdate === "user_message_chunk").map((u) => u.content.text),
  };
});

child.stdin.end();
process.stdout.write(JSON.stringify(report) + "\n");
await new Promise((resolve) => child.on("exit", resolve));
