// Playground: one chat request, streamed, steered and unsteered side by side, with what the armed
// probes and rule signals saw per reply and per token. Text from the server is only ever set as textContent.
"use strict";

(() => {
  const { flash } = window.millm;

  // Every extension name this page reads or sends, in one place.
  const FIELDS = {
    withUnsteered: "with_unsteered", // request: both variants in one request
    variant: "millm_variant", // choice: "steered" | "unsteered"
    verdicts: "millm_probe_verdicts", // body / choice / terminal chunk: probe results and rule signals
    tokenScores: "probe_token_scores", // request: each probe result carries token_scores
    tokenScoresKey: "token_scores", // result: {positions, scores}
    steering: "millm_steering", // terminal chunk: the X-miLLM-Steering value when streaming
    millm: "millm", // body / chunk: {sae_activations: {...}}
    saeActivations: "return_sae_activations", // request
  };
  const SAE_TOP_K = 5;

  const $ = (id) => document.getElementById(id);
  const form = $("chat-form");
  if (!form) return;

  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [name, value] of Object.entries(attrs || {})) {
      if (name === "class") node.className = value;
      else if (name === "text") node.textContent = value;
      else if (value !== undefined && value !== null && value !== false) node.setAttribute(name, value === true ? "" : value);
    }
    for (const child of children) if (child !== null && child !== undefined) node.append(child instanceof Node ? child : String(child));
    return node;
  }

  function headers(extra) {
    const h = { Accept: "application/json", ...(extra || {}) };
    const found = document.cookie.split("; ").find((c) => c.startsWith("millm_admin_key="));
    if (found && found.length > 16) h.Authorization = `Bearer ${decodeURIComponent(found.slice(16))}`;
    return h;
  }

  async function getJSON(url) {
    const response = await fetch(url, { headers: headers() });
    const data = await response.json().catch(() => null);
    if (!response.ok) throw new Error((data && data.error && data.error.message) || `HTTP ${response.status}`);
    return data;
  }

  // --- the steering panel --------------------------------------------------------------------
  const mode = $("steer-mode");
  function showMode() {
    for (const box of form.querySelectorAll("[data-mode]")) box.hidden = box.dataset.mode !== mode.value;
  }
  mode.addEventListener("change", showMode);
  showMode();

  for (const range of form.querySelectorAll('input[type="range"]')) {
    range.addEventListener("input", () => {
      const out = form.querySelector(`output[for="${range.id}"]`);
      if (out) out.textContent = Number(range.value).toFixed(2);
    });
  }
  const cluster = $("cluster");
  if (cluster) cluster.addEventListener("change", () => {
    const option = cluster.selectedOptions[0];
    const dial = $("cluster-intensity");
    dial.max = option.dataset.max || 2;
    dial.value = option.dataset.intensity || 1;
    dial.dispatchEvent(new Event("input"));
  });

  const featureList = $("features");
  const labelCache = new Map(); // "sae|index" → label

  function addFeature(index, label, strength) {
    if (!featureList) return;
    const sae = $("sae").selectedOptions[0];
    const dSae = Number(sae.dataset.dSae);
    if (!Number.isInteger(index) || index < 0 || (dSae && index >= dSae)) {
      $("feature-results").replaceChildren(el("li", { class: "refusal", text: `No feature #${index}: this SAE has features 0–${dSae - 1}.` }));
      return;
    }
    const existing = featureList.querySelector(`li[data-index="${index}"]`);
    if (existing) { existing.querySelector("input[type=number]").focus(); return; }
    const id = `feature-${index}`;
    const slider = el("input", { type: "range", min: -100, max: 100, step: 0.5, value: strength || 0, id: `${id}-slider`, "aria-label": `strength of feature ${index}` });
    const number = el("input", { type: "number", step: 0.5, value: strength || 0, id: `${id}-strength`, class: "strength", "aria-label": `strength of feature ${index} (number)` });
    slider.addEventListener("input", () => { number.value = slider.value; });
    number.addEventListener("input", () => { slider.value = number.value; });
    const remove = el("button", { type: "button", class: "link", "aria-label": `remove feature ${index}`, text: "✕" });
    const item = el("li", { "data-index": index, class: "feature" },
      el("span", { class: "feature-name" }, `#${index}`, label ? " " : "", label ? el("span", { class: "feature-label", text: label }) : null),
      slider, number, remove);
    remove.addEventListener("click", () => { item.remove(); $("features-empty").hidden = featureList.children.length > 0; });
    featureList.append(item);
    $("features-empty").hidden = true;
    if (label === undefined) labelOf($("sae").value, index).then((found) => {
      if (found) item.querySelector(".feature-name").append(" ", el("span", { class: "feature-label", text: found }));
    });
  }

  async function labelOf(saeId, index) {
    const key = `${saeId}|${index}`;
    if (labelCache.has(key)) return labelCache.get(key);
    let label = null;
    try {
      // The first labelled feature from this index on (a search never answers 404 for an unlabelled one).
      const after = index > 0 ? `&after=${index - 1}` : "";
      const found = await getJSON(`/api/saes/${encodeURIComponent(saeId)}/labels?limit=1${after}`);
      const row = (found.data || [])[0];
      label = row && row.index === index ? row.label : null;
    } catch (e) { label = null; }
    labelCache.set(key, label);
    return label;
  }

  async function findFeature() {
    const query = $("feature-query").value.trim();
    const results = $("feature-results");
    results.replaceChildren();
    if (!query) return;
    if (/^\d+$/.test(query)) { addFeature(Number(query)); return; }
    const saeId = $("sae").value;
    try {
      const found = await getJSON(`/api/saes/${encodeURIComponent(saeId)}/labels?limit=20&q=${encodeURIComponent(query)}`);
      const rows = found.data || [];
      if (!rows.length) {
        results.append(el("li", { class: "muted", text: `No label matches “${query}”. Import labels on the Steering page, or add the feature by its index.` }));
      }
      for (const row of rows) {
        labelCache.set(`${saeId}|${row.index}`, row.label);
        const add = el("button", { type: "button", text: `Add #${row.index}` });
        add.addEventListener("click", () => addFeature(row.index, row.label));
        results.append(el("li", {}, add, " ", el("span", { class: "feature-label", text: row.label })));
      }
    } catch (error) {
      results.append(el("li", { class: "refusal", text: error.message }));
    }
  }
  if ($("feature-search")) {
    $("feature-search").addEventListener("click", findFeature);
    $("feature-add").addEventListener("click", () => {
      const query = $("feature-query").value.trim();
      if (/^\d+$/.test(query)) addFeature(Number(query)); else findFeature();
    });
    $("feature-query").addEventListener("keydown", (event) => {
      if (event.key === "Enter") { event.preventDefault(); $("feature-add").click(); }
    });
    $("sae").addEventListener("change", () => { featureList.replaceChildren(); $("features-empty").hidden = false; });
  }

  if ($("circuit-activate")) $("circuit-activate").addEventListener("click", async () => {
    const id = $("circuit").value;
    const response = await fetch(`/api/circuits/${encodeURIComponent(id)}/activate`, { method: "POST", headers: headers() });
    if (response.ok) flash(`Circuit ${id} is active: it steers every request until deactivated.`, "ok");
    else flash(`Could not activate ${id}: HTTP ${response.status}`, "refusal");
  });

  // --- the request -----------------------------------------------------------------------------
  function buildRequest() {
    const messages = [];
    const system = $("system").value.trim();
    if (system) messages.push({ role: "system", content: system });
    messages.push({ role: "user", content: $("prompt").value });
    const body = {
      model: form.dataset.model || undefined,
      messages,
      stream: true,
      stream_options: { include_usage: true },
      logprobs: true,
      temperature: Number($("temperature").value),
      top_p: Number($("top_p").value),
      max_tokens: Number($("max_tokens").value),
    };
    if (!body.model) delete body.model;
    if ($("seed").value !== "") body.seed = Number($("seed").value);
    const stop = $("stop").value.split(",").map((s) => s.trim()).filter(Boolean);
    if (stop.length) body.stop = stop;
    const steering = steeringFields();
    Object.assign(body, steering);
    if ($("with-unsteered").checked) body[FIELDS.withUnsteered] = true;
    if ($("token-scores").checked) body[FIELDS.tokenScores] = true;
    const sae = $("sae");
    if ($("sae-features").checked && sae) body[FIELDS.saeActivations] = { sae_id: sae.value, top_k: SAE_TOP_K, positions: "completion" };
    return body;
  }

  function steeringFields() {
    switch (mode.value) {
      case "features": {
        const features = [...featureList.querySelectorAll("li.feature")].map((li) => ({
          index: Number(li.dataset.index), strength: Number(li.querySelector("input.strength").value),
        }));
        return { steering: { sae_id: $("sae").value, features } };
      }
      case "profile": return { profile: $("profile").value, steering_intensity: Number($("profile-intensity").value) };
      case "cluster": return { profile: $("cluster").value, steering_intensity: Number($("cluster-intensity").value) };
      default: return {}; // "none" and "circuit": the server's own state (an active circuit steers)
    }
  }

  // --- replies ---------------------------------------------------------------------------------
  let replies = new Map(); // choice index → reply state
  let controller = null;
  let lastRequest = null;

  function reply(index, variant) {
    if (!replies.has(index)) {
      const box = el("article", { class: "reply", "data-choice": index });
      const title = el("h3", {});
      const text = el("div", { class: "reply-text", "aria-live": "polite" });
      const verdicts = el("div", { class: "reply-verdicts" });
      box.append(title, text, verdicts);
      $("replies").append(box);
      replies.set(index, { index, box, title, text, verdicts, content: "", tokens: [], results: null, finish: null, sae: null });
      $("replies-empty").hidden = true;
    }
    const r = replies.get(index);
    if (variant) r.variant = variant;
    r.box.dataset.variant = r.variant || "";
    r.title.textContent = r.variant ? `${r.variant[0].toUpperCase()}${r.variant.slice(1)}` : `Reply ${index + 1}`;
    return r;
  }

  function defaultVariant(index) {
    if (!lastRequest || !lastRequest[FIELDS.withUnsteered]) return null;
    return index === 0 ? "steered" : "unsteered";
  }

  function onChunk(chunk, state) {
    if (chunk.error) throw new Error(chunk.error.message || "the stream failed");
    for (const choice of chunk.choices || []) {
      const r = reply(choice.index || 0, choice[FIELDS.variant] || defaultVariant(choice.index || 0));
      const delta = choice.delta || {};
      if (delta.content) { r.content += delta.content; r.text.textContent = r.content; }
      if (choice.logprobs && choice.logprobs.content) r.tokens.push(...choice.logprobs.content.map((t) => t.token));
      if (choice.finish_reason) r.finish = choice.finish_reason;
      if (choice[FIELDS.verdicts]) r.results = choice[FIELDS.verdicts];
      if (choice[FIELDS.millm] && choice[FIELDS.millm].sae_activations) r.sae = choice[FIELDS.millm].sae_activations;
    }
    if (chunk.usage) state.usage = chunk.usage;
    if (chunk[FIELDS.verdicts]) state.verdicts = chunk[FIELDS.verdicts];
    if (chunk[FIELDS.steering] !== undefined) state.steering = chunk[FIELDS.steering];
    if (chunk[FIELDS.millm] && chunk[FIELDS.millm].sae_activations) state.sae = chunk[FIELDS.millm].sae_activations;
  }

  async function readStream(response, state) {
    const reader = response.body.getReader();
    const decoder = new TextDecoder();
    let buffer = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buffer += decoder.decode(value, { stream: true });
      let cut;
      while ((cut = buffer.indexOf("\n\n")) >= 0) {
        const event = buffer.slice(0, cut);
        buffer = buffer.slice(cut + 2);
        const data = event.split("\n").filter((l) => l.startsWith("data:")).map((l) => l.slice(5).trimStart()).join("\n");
        if (!data || data === "[DONE]") continue;
        onChunk(JSON.parse(data), state);
      }
    }
  }

  async function send(event) {
    event.preventDefault();
    const error = $("request-error");
    error.textContent = "";
    if (controller) controller.abort();
    lastRequest = buildRequest();
    $("request-json").textContent = JSON.stringify(lastRequest, null, 2);
    $("copy-curl").disabled = $("copy-python").disabled = false;
    replies = new Map();
    $("replies").replaceChildren();
    $("token-detail").replaceChildren();
    $("headers").replaceChildren(el("p", { class: "muted", text: "Waiting for the reply…" }));
    form.dataset.state = "sending";
    controller = new AbortController();
    $("stop-stream").disabled = false;
    const state = { usage: null, verdicts: null, steering: undefined, sae: null, headers: null };
    const post = () => fetch("/v1/chat/completions", {
      method: "POST", headers: headers({ "Content-Type": "application/json", Accept: "text/event-stream" }),
      body: JSON.stringify(lastRequest), signal: controller.signal,
    });
    try {
      let response = await post();
      let data = response.ok ? null : await response.json().catch(() => null);
      const refused = data && data.error && `${data.error.param || ""} ${data.error.message || ""}`;
      if (refused && refused.includes(FIELDS.saeActivations) && lastRequest[FIELDS.saeActivations]) {
        // Activations have one position axis; a server that refuses them beside this request (two
        // variants, say) still answers the rest: send it again without them, and say so.
        delete lastRequest[FIELDS.saeActivations];
        $("request-json").textContent = JSON.stringify(lastRequest, null, 2);
        error.textContent = `SAE features per token were refused (${data.error.message}); sent without them.`;
        response = await post();
        data = response.ok ? null : await response.json().catch(() => null);
      }
      state.headers = response.headers;
      if (!response.ok) throw new Error((data && data.error && data.error.message) || `HTTP ${response.status}`);
      await readStream(response, state);
      finish(state);
      form.dataset.state = "done";
    } catch (failure) {
      if (failure.name === "AbortError") { form.dataset.state = "stopped"; error.textContent = "Stopped."; }
      else { form.dataset.state = "failed"; error.textContent = failure.message; }
      $("headers").replaceChildren(el("p", { class: "muted", text: "No reply." }));
      if (state.headers) renderHeaders(state);
    } finally {
      $("stop-stream").disabled = true;
      controller = null;
    }
  }

  function finish(state) {
    const first = replies.get(0) || reply(0, defaultVariant(0));
    if (!first.results && state.verdicts) first.results = state.verdicts;
    if (!first.sae && state.sae) first.sae = state.sae;
    const promptTokens = state.usage ? state.usage.prompt_tokens : null;
    for (const r of replies.values()) {
      r.box.dataset.complete = "true";
      renderTokens(r, promptTokens);
      renderVerdicts(r);
    }
    renderHeaders(state);
  }

  // --- per-token heat map ----------------------------------------------------------------------
  function scoresAt(r) {
    // probe name → Map(position → score)
    const out = [];
    for (const result of r.results || []) {
      const ts = result[FIELDS.tokenScoresKey];
      if (!ts || !ts.positions) continue;
      const map = new Map();
      ts.positions.forEach((p, i) => map.set(p, ts.scores[i]));
      out.push({ name: result.name || result.probe_id || result.signal || "probe", threshold: result.threshold, map, result });
    }
    return out;
  }

  function heat(score, threshold, low, high) {
    // Blue below the threshold, red above it; the further, the stronger.
    if (score === undefined || score === null || !Number.isFinite(score)) return "";
    const mid = Number.isFinite(threshold) ? threshold : (low + high) / 2;
    const span = Math.max(Math.abs(high - mid), Math.abs(mid - low), 1e-9);
    const t = Math.min(1, Math.abs(score - mid) / span);
    const alpha = (0.12 + 0.6 * t).toFixed(2);
    return score >= mid ? `rgba(207, 34, 46, ${alpha})` : `rgba(9, 105, 218, ${alpha})`;
  }

  function renderTokens(r, promptTokens) {
    if (!r.tokens.length) return;
    const probes = scoresAt(r);
    const shown = probes[r.shownProbe || 0];
    const all = shown ? [...shown.map.values()].filter(Number.isFinite) : [];
    const low = Math.min(...all), high = Math.max(...all);
    const saeAt = new Map(((r.sae && r.sae.positions) || []).map((p) => [p.position, p]));
    const cells = r.tokens.map((token, i) => {
      const position = promptTokens === null ? null : promptTokens + i;
      const attrs = { class: "tok", tabindex: 0, "data-i": i };
      if (position !== null) attrs["data-position"] = position;
      if (shown && position !== null && shown.map.has(position)) {
        const score = shown.map.get(position);
        attrs["data-score"] = score;
        attrs.style = `background:${heat(score, shown.threshold, low, high)}`;
      }
      const cell = el("span", attrs, token);
      const show = () => detail(r, token, position, probes, saeAt.get(position));
      cell.addEventListener("mouseenter", show);
      cell.addEventListener("focus", show);
      return cell;
    });
    let pick = null;
    if (probes.length > 1) {
      pick = el("select", { "aria-label": "probe whose scores colour the reply" },
        ...probes.map((p, i) => el("option", { value: i, selected: i === (r.shownProbe || 0) }, p.name)));
      pick.addEventListener("change", () => { r.shownProbe = Number(pick.value); renderTokens(r, promptTokens); });
    }
    const legend = shown
      ? el("p", { class: "heat-legend muted" }, "Heat: ", pick || shown.name, "'s score per token",
          Number.isFinite(shown.threshold) ? ` (red above its threshold ${shown.threshold}, blue below)` : "",
          ". Hover or focus a token for its scores.")
      : el("p", { class: "heat-legend muted", text: (r.results || []).length
        ? "No per-token scores came back: tick “per-token probe scores” and send again. Hover or focus a token for its features."
        : "No per-token scores: arm a probe on the Probe Monitors page to see them. Hover or focus a token for its features." });
    r.text.replaceChildren(el("div", { class: "heatmap", "data-probe": shown ? shown.name : "" }, ...cells), legend);
  }

  function detail(r, token, position, probes, sae) {
    const box = $("token-detail");
    const rows = probes.map((p) => el("tr", {}, el("th", { text: p.name }),
      el("td", { text: p.map.has(position) ? Number(p.map.get(position)).toPrecision(4) : "—" }),
      el("td", { class: "muted", text: Number.isFinite(p.threshold) ? `threshold ${p.threshold}` : "" })));
    const features = sae ? (sae.features || []).map((f) => el("li", {}, `#${f.index} `, f.label ? el("span", { class: "feature-label", text: f.label }) : "", ` ${Number(f.value).toFixed(3)}`)) : [];
    box.replaceChildren(
      el("h3", {}, `${r.variant || "reply"} token `, el("code", { class: "token", text: token }), position !== null ? ` at position ${position}` : ""),
      rows.length ? el("table", { class: "token-scores" }, ...rows) : el("p", { class: "muted", text: "No probe scored this token." }),
      features.length ? el("div", {}, el("h4", { text: "Top SAE features" }), el("ul", { class: "plain" }, ...features))
        : el("p", { class: "muted", text: sae === undefined && r.sae ? "No SAE activation here (the last token is never read)." : (r.sae ? "No feature fired." : "No SAE activations for this reply.") }),
    );
  }

  function renderVerdicts(r) {
    const results = r.results || [];
    if (!results.length) {
      r.verdicts.replaceChildren(el("p", { class: "muted", text: "No armed probe or rule set reported on this reply." }));
      return;
    }
    const rows = results.map((v) => {
      // As verdicts.py reads a result: a probe's verdict, or a rule's fires (with its count).
      const decision = v.kind === "rule" ? v.fires : v.verdict;
      const fired = decision === true;
      const word = typeof decision !== "boolean" ? `${v.outcome || "unknown"}${v.reason ? `: ${v.reason}` : ""}`
        : v.kind === "rule" ? (fired ? `fired · count ${v.count}` : "not fired") : (fired ? "fired" : "quiet");
      return el("tr", { "data-result": v.name || v.probe_id || "" },
        el("td", { text: v.kind === "rule" ? "rule" : "probe" }),
        el("td", { text: v.name || v.signal || v.probe_id || "" }),
        el("td", { text: v.window || "" }),
        el("td", {}, el("span", { class: `badge ${fired ? "fired" : (decision === false ? "quiet" : "")}`, text: word })),
        el("td", { text: typeof v.score === "number" ? v.score.toPrecision(4) : "—" }),
        el("td", { text: typeof v.threshold === "number" ? String(v.threshold) : "" }));
    });
    r.verdicts.replaceChildren(el("table", { class: "verdicts" },
      el("thead", {}, el("tr", {}, ...["", "name", "window", "verdict", "score", "threshold"].map((h) => el("th", { text: h })))),
      el("tbody", {}, ...rows)));
  }

  // --- headers, for people ---------------------------------------------------------------------
  function splitTop(text, sep) {
    // Split an RFC 8941 list/parameters at sep, outside quoted strings.
    const parts = [];
    let cur = "", quoted = false;
    for (let i = 0; i < text.length; i++) {
      const c = text[i];
      if (c === "\\" && quoted) { cur += c + (text[i + 1] || ""); i++; continue; }
      if (c === '"') quoted = !quoted;
      if (c === sep && !quoted) { parts.push(cur.trim()); cur = ""; } else cur += c;
    }
    if (cur.trim()) parts.push(cur.trim());
    return parts;
  }

  function parseSteering(value) {
    return splitTop(value, ",").map((member) => {
      const [kind, ...params] = splitTop(member, ";");
      const out = { kind, params: {} };
      for (const p of params) {
        const eq = p.indexOf("=");
        const key = eq < 0 ? p : p.slice(0, eq);
        let v = eq < 0 ? true : p.slice(eq + 1);
        if (typeof v === "string" && v.startsWith('"')) v = v.slice(1, -1).replace(/\\(.)/g, "$1");
        out.params[key] = v;
      }
      return out;
    });
  }

  const PARAM_WORDS = {
    sae: "SAE", layer: "layer", features: "features applied", hash: "hash of the applied set", clamped: "features clamped at ±200",
    name: "profile", source: "from", intensity: "intensity λ", id: "circuit", composed: "shares a layer with another circuit",
    changed: "steering changed during the request", reason: "why unknown",
  };

  // fetch gives header names in lower case; show them as the server spells them.
  const headerName = (name) => name.split("-").map((w) => (w === "millm" ? "miLLM" : w.charAt(0).toUpperCase() + w.slice(1))).join("-");

  const HEADER_WORDS = {
    "x-millm-seed": "the seed applied", "x-millm-circuit-rung": "the active circuit's evidence rung",
    "x-millm-steering-intensity": "the dial λ, echoed before generation", "x-millm-ignored-fields": "fields ignored",
    "x-millm-model": "the model that answered", "x-millm-session-id": "the session this turn was recorded in",
  };

  function renderHeaders(state) {
    const box = $("headers");
    const parts = [];
    const steering = state.steering !== undefined ? state.steering : (state.headers && state.headers.get("x-millm-steering"));
    if (steering) {
      const members = parseSteering(steering);
      const list = el("ul", { class: "steering-members plain" });
      for (const m of members) {
        const facts = el("dl", { class: "facts" });
        for (const [key, value] of Object.entries(m.params)) {
          let shown = value === true ? "yes" : value;
          if (key === "name") { try { shown = decodeURIComponent(value); } catch (e) { shown = value; } }
          facts.append(el("dt", { text: PARAM_WORDS[key] || key }), el("dd", {}, key === "hash" ? el("code", { class: "hash", text: shown }) : shown));
        }
        list.append(el("li", { "data-kind": m.kind }, el("strong", { text: m.kind === "none" ? "Not steered" : `Steered: ${m.kind}` }), facts));
      }
      parts.push(el("section", { id: "steering-header" }, el("h4", {}, "X-miLLM-Steering ", el("span", { class: "muted", text: state.steering !== undefined ? "(from the stream's last chunk)" : "" })),
        list, el("details", {}, el("summary", { text: "raw" }), el("code", { text: steering }))));
    }
    const rows = [];
    if (state.headers) {
      state.headers.forEach((value, name) => {
        if (!name.startsWith("x-millm-") || name === "x-millm-steering") return;
        let shown = el("code", { text: value });
        if (name === "x-millm-ignored-fields") {
          // An RFC 8941 list of strings: fields this server did not use (an older server's unknown extension, say).
          const fields = splitTop(value, ",").map((f) => f.replace(/^"|"$/g, ""));
          shown = el("span", { class: "note" }, "not used by the server: ", ...fields.flatMap((f, i) => [i ? ", " : "", el("code", { text: f })]));
        }
        rows.push(el("tr", { "data-header": name }, el("th", { text: headerName(name) }),
          el("td", { class: "muted", text: HEADER_WORDS[name] || "" }), el("td", {}, shown)));
      });
    }
    if (rows.length) parts.push(el("table", { class: "headers" }, ...rows));
    box.replaceChildren(...(parts.length ? parts : [el("p", { class: "muted", text: "No X-miLLM-* header came back." })]));
  }

  // --- copy as curl / Python -------------------------------------------------------------------
  function curl(body) {
    const json = JSON.stringify(body, null, 2).replace(/'/g, "'\\''");
    return `curl -N ${location.origin}/v1/chat/completions \\\n  -H 'Content-Type: application/json' \\\n  -H "Authorization: Bearer $MILLM_API_KEY" \\\n  -d '${json}'`;
  }

  function python(body) {
    const standard = ["model", "messages", "stream", "stream_options", "logprobs", "temperature", "top_p", "max_tokens", "seed", "stop"];
    const args = [];
    const extra = {};
    for (const [key, value] of Object.entries(body)) {
      if (standard.includes(key)) args.push(`    ${key}=${py(value)},`);
      else extra[key] = value;
    }
    if (!body.model) args.unshift("    model=client.models.list().data[0].id,");
    if (Object.keys(extra).length) args.push(`    extra_body=${py(extra)},`);
    return `from openai import OpenAI\n\nclient = OpenAI(base_url="${location.origin}/v1", api_key="...")\nstream = client.chat.completions.create(\n${args.join("\n")}\n)\nfor chunk in stream:\n    for choice in chunk.choices:\n        print(choice.index, choice.delta.content or "", end="")\n`;
  }

  function py(value) {
    if (value === true) return "True";
    if (value === false) return "False";
    if (value === null) return "None";
    if (Array.isArray(value)) return `[${value.map(py).join(", ")}]`;
    if (typeof value === "object") return `{${Object.entries(value).map(([k, v]) => `${JSON.stringify(k)}: ${py(v)}`).join(", ")}}`;
    return JSON.stringify(value);
  }

  async function copy(text, what) {
    $("request-json").textContent = text;
    $("request-json").closest("details").open = true;
    try {
      await navigator.clipboard.writeText(text);
      flash(`Copied the request as ${what}.`, "ok");
    } catch (e) {
      flash(`The clipboard refused; the request as ${what} is shown under “Request sent”.`, "busy");
    }
  }

  $("copy-curl").addEventListener("click", () => lastRequest && copy(curl(lastRequest), "curl"));
  $("copy-python").addEventListener("click", () => lastRequest && copy(python(lastRequest), "Python"));
  $("stop-stream").addEventListener("click", () => controller && controller.abort());
  form.addEventListener("submit", send);
  $("prompt").addEventListener("keydown", (event) => {
    if (event.key === "Enter" && (event.ctrlKey || event.metaKey)) form.requestSubmit();
  });
  window.millmPlayground = { FIELDS, parseSteering, curl, python };
})();
