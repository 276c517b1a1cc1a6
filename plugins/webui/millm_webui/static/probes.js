// Probe Monitors: import, the arm dialog (gates, acknowledgement below rung 2), dry run, a probe's
// parity check (its report) and deletion, live verdicts.
"use strict";

(() => {
  const { api, flash, el, errorMessage, adminKey } = window.millm;
  const HALVES = [["per_token", "per generated token"], ["per_1k_prompt", "per 1,000 prompt tokens"]];

  function costLines(projection) {
    if (!projection) return [];
    return HALVES.map(([half, words]) => {
      const h = projection[half];
      return el("li", { class: h.fits ? "" : "refusal" },
        `cost ${words}: ${h.cost_ms} ms of ${h.fillable_ms} ms (${h.source})${h.fits ? "" : " — over the budget"}`);
    });
  }

  // "gate evidence: <the API's message> [CODE]": the gate named once, whether or not the message names it.
  function gateText(refusal) {
    const message = refusal.message || "";
    const named = message.startsWith(`gate ${refusal.gate}`) ? message : `gate ${refusal.gate}: ${message}`;
    return `${named} [${refusal.code}]`;
  }

  // Each probe's gates and the set's, as the API reports them (the spec's gate names, its messages verbatim).
  function renderGates(box, report) {
    box.replaceChildren();
    const list = el("ul", { class: "gates" });
    for (const probe of report.probes || []) {
      const head = `${probe.name} (${probe.probe_id}): `;
      const item = probe.gate
        ? el("li", { class: "refusal", "data-gate": probe.gate }, head + gateText(probe))
        : el("li", { class: "ok", "data-gate": "" }, head + "passes every gate" +
            (probe.parity ? ` (parity ${probe.parity.status})` : ""));
      for (const warning of probe.warnings || []) item.append(el("div", { class: "note" }, `warning: ${warning}`));
      list.append(item);
    }
    for (const already of report.already_armed || []) list.append(el("li", {}, `${already}: already armed`));
    for (const gate of report.set_gates || []) {
      list.append(el("li", { class: "refusal", "data-gate": gate.gate }, `the set: ${gateText(gate)}`));
    }
    box.append(list);
    if (report.projected_cost) {
      box.append(el("p", {}, `Projected cost of the armed set with these probes (budget ${report.projected_cost.basis}):`));
      box.append(el("ul", { class: "cost" }, ...costLines(report.projected_cost)));
    }
  }

  async function dryRun(key) {
    return api("POST", `/api/probes/behaviours/${encodeURIComponent(key)}/arm`, { dry_run: true });
  }

  // --- the arm dialog --------------------------------------------------------------------
  const dialog = document.getElementById("arm-dialog");
  let arming = null; // {url, needsAck}

  async function openArm(key, url, needsAck, dryRunUrl) {
    arming = { url, needsAck };
    document.getElementById("arm-key").textContent = key;
    document.getElementById("arm-refusal").textContent = "";
    document.getElementById("arm-ack").value = "";
    document.getElementById("arm-ack-block").hidden = !needsAck;
    const gates = document.getElementById("arm-gates");
    gates.replaceChildren(el("p", { class: "note" }, "Running the gates (dry run)…"));
    dialog.showModal();
    if (dryRunUrl) {
      const answer = await api("POST", dryRunUrl, { dry_run: true });
      if (answer.ok) renderGates(gates, answer.data);
      else gates.replaceChildren(el("p", { class: "refusal" }, errorMessage(answer)));
    } else {
      gates.replaceChildren();
    }
  }

  async function confirmArm(button) {
    const body = {};
    const ack = document.getElementById("arm-ack").value.trim();
    if (arming.needsAck) {
      if (!ack) {
        document.getElementById("arm-refusal").textContent =
          "gate evidence: a probe here is below rung 2; write the acknowledgement to arm it";
        return;
      }
      body.acknowledgement = ack;
    }
    button.disabled = true;
    try {
      const answer = await api("POST", arming.url, body);
      if (!answer.ok) {
        document.getElementById("arm-refusal").textContent = errorMessage(answer);
        if (answer.data && answer.data.error && answer.data.error.probes) {
          renderGates(document.getElementById("arm-gates"), answer.data.error);
        }
        return;
      }
      dialog.close();
      window.location.reload();
    } finally {
      button.disabled = false;
    }
  }

  // --- Check parity: the report POST /api/probes/{id}/parity answers, vector by vector and shape by shape -----
  // six significant digits; a difference far below the tolerance in exponent form, not a run of zeros
  const number = (x) => (typeof x !== "number" ? "—" : x !== 0 && Math.abs(x) < 1e-3 ? x.toExponential(5) : x.toPrecision(6));

  function renderParity(box, report) {
    const shapes = report.shapes_checked || [];
    const heading = el("p", { class: `parity-status ${report.status === "passed" ? "ok" : "refusal"}`,
      "data-status": report.status }, `Parity ${report.status}`, report.reason ? `: ${report.reason}` : "");
    const facts = el("p", { class: "muted" }, `tolerance ${report.tolerance} · shapes checked: ${shapes.join(", ") || "none"}`);
    for (const [shape, why] of Object.entries(report.shapes_not_checked || {})) {
      facts.append(` · ${shape} not checked: ${why}`);
    }
    const head = el("tr", {}, ...["Vector", "Score", "Recorded", "Difference", ...shapes, "Result"].map((h) => el("th", {}, h)));
    const rows = (report.vectors || []).map((v) => el("tr", { "data-vector": v.index },
      el("td", {}, String(v.index)), el("td", { class: "score" }, number(v.score)),
      el("td", { class: "recorded" }, number(v.recorded)), el("td", { class: "difference" }, number(v.difference)),
      ...shapes.map((shape) => {
        const row = (v.shapes || {})[shape];
        if (!row) return el("td", { "data-shape": shape }, "—");
        const word = row.passed ? "passed" : `failed${row.reason || row.error ? ": " + (row.reason || row.error) : ""}`;
        return el("td", { "data-shape": shape, class: row.passed ? "ok" : "refusal" },
          `${word} (${number(row.score)}, difference ${number(row.difference)})`);
      }),
      el("td", { class: v.passed ? "ok result" : "refusal result" }, v.passed ? "passed" : `failed${v.reason ? ": " + v.reason : ""}`)));
    box.replaceChildren(heading, facts, el("table", { class: "parity-vectors" }, el("thead", {}, head), el("tbody", {}, ...rows)));
  }

  async function checkParity(button) {
    const id = button.dataset.parity;
    const box = document.getElementById(`parity-${id}`);
    box.hidden = false;
    box.replaceChildren(el("p", { class: "muted" }, "Checking parity on the resident model…"));
    button.disabled = true;
    try {
      const answer = await api("POST", `/api/probes/${encodeURIComponent(id)}/parity`);
      if (answer.ok) renderParity(box, answer.data);
      else box.replaceChildren(el("p", { class: "refusal parity-status", "data-status": "error" }, errorMessage(answer)));
    } finally {
      button.disabled = false;
    }
  }

  // --- Delete: asked in the page's own dialog; an armed probe is disarmed first ----------------------
  const deleteDialog = document.getElementById("delete-dialog");
  let deleting = null; // {id, armed}

  function openDelete(button) {
    deleting = { id: button.dataset.deleteProbe, armed: button.dataset.armed !== undefined };
    document.getElementById("delete-name").textContent = `${button.dataset.name} (${deleting.id})`;
    document.getElementById("delete-armed").hidden = !deleting.armed;
    document.getElementById("delete-refusal").textContent = "";
    deleteDialog.showModal();
  }

  async function confirmDelete(button) {
    const url = `/api/probes/${encodeURIComponent(deleting.id)}`;
    button.disabled = true;
    try {
      if (deleting.armed) {
        const disarmed = await api("POST", `${url}/disarm`);
        if (!disarmed.ok) { document.getElementById("delete-refusal").textContent = errorMessage(disarmed); return; }
      }
      const answer = await api("DELETE", url);
      if (!answer.ok) { document.getElementById("delete-refusal").textContent = errorMessage(answer); return; }
      deleteDialog.close();
      window.location.reload();
    } finally {
      button.disabled = false;
    }
  }

  document.addEventListener("click", async (event) => {
    const button = event.target.closest("button");
    if (!button) return;
    if (button.dataset.parity) {
      checkParity(button);
    } else if (button.dataset.deleteProbe) {
      openDelete(button);
    } else if (button.id === "delete-confirm") {
      confirmDelete(button);
    } else if (button.dataset.arm) {
      // a group's Arm, or "Arm … again" after a restart: the lowest rung is on the button or its group
      const holder = button.dataset.minRung !== undefined ? button : button.closest("[data-behaviour]");
      const key = button.dataset.arm;
      const url = `/api/probes/behaviours/${encodeURIComponent(key)}/arm`;
      openArm(key, url, Number(holder.dataset.minRung) < 2, url);
    } else if (button.dataset.armProbe) {
      const id = button.dataset.armProbe;
      openArm(id, `/api/probes/${encodeURIComponent(id)}/arm`, Number(button.dataset.rung) < 2, null);
    } else if (button.dataset.dryRun) {
      const box = button.closest("[data-behaviour]").querySelector(".dry-run-result");
      box.hidden = false;
      box.replaceChildren(el("p", { class: "note" }, "Running every gate; nothing is armed…"));
      const answer = await dryRun(button.dataset.dryRun);
      if (!answer.ok) { box.replaceChildren(el("p", { class: "refusal" }, errorMessage(answer))); return; }
      renderGates(box, answer.data);
      box.prepend(el("p", { class: answer.data.would_arm ? "ok" : "refusal" },
        answer.data.would_arm ? "Dry run: the behaviour would arm." : "Dry run: the behaviour would not arm."));
    } else if (button.id === "arm-confirm") {
      confirmArm(button);
    }
  });

  // --- live verdicts ---------------------------------------------------------------------
  const state = document.getElementById("feed-state");
  const live = document.getElementById("live-verdicts");

  // As verdicts.py says it: a probe's verdict, or a rule's fires and count (a rule carries no verdict).
  function verdictWord(r) {
    if (r.kind === "rule" && typeof r.fires === "boolean") return r.fires ? `fired · count ${r.count}` : "not fired";
    if (r.kind !== "rule" && r.verdict === true) return "fired";
    if (r.kind !== "rule" && r.verdict === false) return "quiet";
    return `${r.outcome}${r.reason ? ": " + r.reason : ""}`;
  }

  function showResults(message) {
    for (const r of message.results || []) {
      const score = typeof r.score === "number" ? r.score.toPrecision(4) : "—";
      const item = el("li", { "data-result": r.result_id, class: r.fires ? "fires" : "" },
        `${r.behaviour ? r.behaviour + " · " : ""}${r.name} · ${r.window} · score ${score} · `,
        el("strong", { class: "verdict" }, verdictWord(r)),
        message.session_id ? ` · session ${message.session_id} turn ${message.turn}` : "", " · ",
        el("a", { href: `/ui/probes/events/${encodeURIComponent(r.result_id)}` }, "detail"));
      live.prepend(item);
      const count = document.querySelector(`#results-${CSS.escape(r.probe_id)} .count`);
      if (count) {
        const results = Number(count.dataset.results) + 1;
        const fired = Number(count.dataset.fired) + (r.fires ? 1 : 0);
        count.dataset.results = results; count.dataset.fired = fired;
        count.textContent = `${results} results · ${fired} fired`;
      }
    }
  }

  function openSocket() {
    const url = new URL(document.getElementById("live").dataset.feed, window.location.href);
    url.protocol = url.protocol === "https:" ? "wss:" : "ws:";
    const socket = new WebSocket(url);
    socket.addEventListener("open", () => { state.textContent = "live"; state.dataset.state = "live"; });
    socket.addEventListener("message", (event) => showResults(JSON.parse(event.data)));
    socket.addEventListener("close", () => { state.textContent = "disconnected"; state.dataset.state = "closed"; });
    window.addEventListener("pagehide", () => socket.close());
  }

  // A browser cannot put an Authorization header on a WebSocket: with an admin key the page polls the
  // results list instead (newest first, only those it has not shown).
  async function poll() {
    state.textContent = "live (polling)"; state.dataset.state = "live";
    const seen = new Set();
    let first = true;
    for (;;) {
      const answer = await api("GET", "/api/probes/events?limit=50");
      if (answer.ok) {
        const fresh = answer.data.data.filter((r) => !seen.has(r.result_id));
        fresh.forEach((r) => seen.add(r.result_id));
        if (!first && fresh.length) showResults({ results: fresh.reverse() });
        first = false;
      }
      await new Promise((resolve) => setTimeout(resolve, 2000));
    }
  }

  if (live) { if (adminKey()) poll(); else openSocket(); }
})();
