// miLLM web UI: the small script layer. Every datum comes from the server's public API;
// text from the server is only ever set as textContent (never as markup).
"use strict";

const KEY_COOKIE = "millm_admin_key";

function adminKey() {
  const found = document.cookie.split("; ").find((c) => c.startsWith(KEY_COOKIE + "="));
  return found ? decodeURIComponent(found.slice(KEY_COOKIE.length + 1)) : "";
}

function setAdminKey(key) {
  // A session cookie (gone when the browser closes), sent to this server's pages only, never cross-site.
  const value = key ? encodeURIComponent(key) : "";
  document.cookie = `${KEY_COOKIE}=${value}; path=/; SameSite=Strict${key ? "" : "; max-age=0"}`;
}

// fetch on this server's API, with the admin key when one is kept. Resolves to {ok, status, data}.
async function api(method, url, body) {
  const headers = { Accept: "application/json" };
  const key = adminKey();
  if (key) headers.Authorization = `Bearer ${key}`;
  const init = { method, headers };
  if (body !== undefined) {
    headers["Content-Type"] = "application/json";
    init.body = typeof body === "string" ? body : JSON.stringify(body);
  }
  const response = await fetch(url, init);
  let data = null;
  const text = await response.text();
  try { data = text ? JSON.parse(text) : null; } catch (e) { data = text; }
  return { ok: response.ok, status: response.status, data };
}

function errorMessage(answer) {
  const error = answer.data && answer.data.error;
  return error ? `${error.message || error.code || "error"}` : `HTTP ${answer.status}`;
}

function flash(text, kind) {
  const box = document.getElementById("flash");
  if (!box) return;
  box.textContent = text;
  box.className = kind || "";
}

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs || {})) {
    if (name === "class") node.className = value;
    else if (name === "text") node.textContent = value;
    else node.setAttribute(name, value);
  }
  for (const child of children) node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  return node;
}

// Load progress: /api/health's status and progress while a load runs.
async function watchProgress(until) {
  const status = document.getElementById("server-status");
  const progress = document.getElementById("load-progress");
  while (!until.done) {
    const answer = await api("GET", "/api/health");
    if (answer.ok && answer.data) {
      const health = answer.data;
      if (status) { status.textContent = health.status; status.dataset.status = health.status; }
      if (progress) progress.textContent = health.progress ? `· ${health.progress}` : "";
      // the card of the model being loaded says so until the page reloads with its new state
      const badge = health.status === "loading" && health.model &&
        document.querySelector(`section.model[data-model="${CSS.escape(health.model)}"] h2 .badge`);
      if (badge) { badge.textContent = "LOADING"; badge.className = "badge state-loading"; }
    }
    await new Promise((resolve) => setTimeout(resolve, 500));
  }
}

// Buttons that call the API: data-post / data-put / data-delete = URL, data-body = JSON,
// data-reload = reload the page after success, data-then = go to this page after success, data-progress = show load progress meanwhile.
async function runAction(button) {
  const method = ["post", "put", "delete"].find((m) => button.dataset[m] !== undefined);
  const url = button.dataset[method];
  button.disabled = true;
  const until = { done: false };
  const watcher = button.dataset.progress !== undefined ? watchProgress(until) : Promise.resolve();
  flash(`${button.textContent.trim()}…`, "busy");
  try {
    const answer = await api(method.toUpperCase(), url, button.dataset.body);
    until.done = true;
    await watcher; // no poll left in flight when the page reloads
    if (!answer.ok) {
      flash(errorMessage(answer), "refusal");
      return answer;
    }
    flash(`${button.textContent.trim()}: done`, "ok");
    if (button.dataset.then) window.location.assign(button.dataset.then);
    else if (button.dataset.reload !== undefined) window.location.reload();
    return answer;
  } finally {
    until.done = true;
    button.disabled = false;
  }
}

// Import a JSON document (a probe, a rule set, a cluster, a circuit): data-import = URL, data-source = the textarea.
async function importDocument(button) {
  const text = document.getElementById(button.dataset.source).value.trim();
  if (!text) { flash("choose a file or paste a document first", "refusal"); return; }
  button.disabled = true;
  try {
    const answer = await api("POST", button.dataset.import, text);
    if (!answer.ok) { flash(errorMessage(answer), "refusal"); return; }
    window.location.reload();
  } finally {
    button.disabled = false;
  }
}

// A dial (input type=range, data-dial = the intensity URL): the value shows as it moves and is
// stored when let go; the server's answer (the dial it kept) is what the page shows.
document.addEventListener("input", (event) => {
  const dial = event.target.closest("input[data-dial]");
  if (dial) dial.parentElement.querySelector("output").textContent = Number(dial.value).toFixed(2);
});

document.addEventListener("change", async (event) => {
  const input = event.target;
  if (input.dataset.fills && input.files && input.files.length) {
    document.getElementById(input.dataset.fills).value = await input.files[0].text();
    return;
  }
  if (input.dataset.dial === undefined) return;
  const answer = await api("PUT", input.dataset.dial, { intensity: Number(input.value) });
  const output = input.parentElement.querySelector("output");
  if (!answer.ok) {
    flash(errorMessage(answer), "refusal");
    input.value = input.dataset.stored;
  } else {
    input.dataset.stored = answer.data.intensity;
    input.value = answer.data.intensity;
    flash(`λ = ${answer.data.intensity}`, "ok");
  }
  output.textContent = Number(input.value).toFixed(2);
  output.dataset.stored = input.dataset.stored;
});

document.addEventListener("click", (event) => {
  const button = event.target.closest("button");
  if (!button) return;
  if (button.dataset.import) {
    importDocument(button);
  } else if (button.dataset.ui === "key-form") {
    document.getElementById("key-dialog").showModal();
  } else if (["post", "put", "delete"].some((m) => button.dataset[m] !== undefined)) {
    event.preventDefault();
    runAction(button);
  }
});

// A form whose fields are a JSON body: data-json = URL, data-method (POST), data-number on numeric fields.
document.addEventListener("submit", async (event) => {
  const form = event.target.closest("form[data-json]");
  if (!form) return;
  event.preventDefault();
  const body = {};
  for (const field of form.elements) {
    if (!field.name || field.value === "") continue;
    body[field.name] = field.dataset.number !== undefined ? Number(field.value) : field.value;
  }
  const answer = await api(form.dataset.method || "POST", form.dataset.json, body);
  if (!answer.ok) { flash(errorMessage(answer), "refusal"); return; }
  window.location.reload();
});

document.addEventListener("DOMContentLoaded", () => {
  const form = document.getElementById("key-form");
  if (form) {
    form.addEventListener("submit", (event) => {
      const choice = event.submitter ? event.submitter.value : "save";
      setAdminKey(choice === "forget" ? "" : form.elements.key.value);
      form.elements.key.value = "";
      window.location.reload();
    });
  }
  const button = document.getElementById("key-button");
  if (button && adminKey()) button.textContent = "Admin key ✓";
});

window.millm = { api, flash, el, errorMessage, adminKey, runAction };
