// mibyan's session viewer: folding helpers and live updates (server-sent events). No inline script:
// the page's Content-Security-Policy allows only this file. Fragments come from the server, escaped.
"use strict";

function openTo(element) {
  // A link to a message inside folded tool calls or subagents opens every fold around it.
  for (let node = element; node; node = node.parentElement) {
    if (node.tagName === "DETAILS") node.open = true;
  }
}

function showTarget() {
  const id = decodeURIComponent(location.hash.slice(1));
  const target = id && document.getElementById(id);
  if (target) {
    openTo(target);
    target.scrollIntoView({ block: "center" });
  }
}

function fragment(html) {
  const template = document.createElement("template");
  template.innerHTML = html;
  return template.content;
}

function findCall(list, callId) {
  for (const call of list.querySelectorAll(":scope > li > details.call")) {
    if (call.dataset.call === callId) return call;
  }
  return null;
}

function appendNew(list, html) {
  // A reader at the bottom of the page follows the conversation; one reading above it stays put.
  const following = window.innerHeight + window.scrollY >= document.body.scrollHeight - 120;
  const content = fragment(html);
  const first = content.firstElementChild;
  list.appendChild(content);
  if (first) {
    first.classList.add("new");
    if (following) first.scrollIntoView({ block: "end" });
  }
}

function listen(list) {
  const status = document.getElementById("live-status");
  const source = new EventSource(list.dataset.live);
  source.addEventListener("open", () => { status.textContent = "live: new messages appear here"; });
  let arrived = 0;
  source.addEventListener("message", (event) => {
    appendNew(list, JSON.parse(event.data).html);
    // the header's totals and the chart were drawn with the page: say so rather than leave them stale
    arrived += 1;
    status.textContent = `live: ${arrived} new since this page was drawn; the totals and the chart above ` +
      "count up to then (reload for the new ones)";
  });
  source.addEventListener("result", (event) => {
    const data = JSON.parse(event.data);
    const call = findCall(list, data.call);
    if (call) {
      const slot = call.querySelector(".slot");
      slot.replaceChildren(fragment(data.html));
      call.classList.add("new");
    } else {
      appendNew(list, data.alone);
    }
  });
  source.addEventListener("subagent", (event) => {
    // A subagent at work: its session is redrawn under the delegate_task call still waiting for it.
    const data = JSON.parse(event.data);
    const drawn = [...list.querySelectorAll("details.subagent")].find((n) => n.dataset.session === data.session);
    const content = fragment(data.html);
    if (drawn) {
      content.firstElementChild.open = drawn.open;
      drawn.replaceWith(content);
      return;
    }
    const waiting = [...list.querySelectorAll(":scope > li > details.call.delegate")]
      .filter((call) => call.querySelector(":scope > .slot > .pending"));
    if (waiting.length) waiting[waiting.length - 1].querySelector(":scope > .slot").appendChild(content);
    else appendNew(list, data.html);
  });
  source.addEventListener("continued", (event) => {
    source.close();
    list.after(fragment(JSON.parse(event.data).html));
    status.textContent = "";
  });
  source.addEventListener("reload", () => {
    source.close();
    location.reload();
  });
  source.addEventListener("error", () => {
    if (source.readyState === EventSource.CLOSED) status.textContent = "live updates stopped";
  });
}

document.addEventListener("DOMContentLoaded", () => {
  const list = document.getElementById("messages");
  if (list && list.dataset.live) listen(list);
  const unfold = document.getElementById("unfold");
  if (unfold) {
    unfold.addEventListener("click", () => {
      const folded = document.querySelectorAll("details.call:not([open]), details.subagent:not([open])");
      const open = folded.length > 0;
      for (const node of document.querySelectorAll("details.call, details.subagent")) node.open = open;
      unfold.textContent = open ? "Fold all" : "Unfold all";
    });
  }
  showTarget();
});
window.addEventListener("hashchange", showTarget);
