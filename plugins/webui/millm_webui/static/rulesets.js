// Rule sets: attach to a behaviour, try a set on text (import: ui.js).
"use strict";

(() => {
  const { api, flash, el, errorMessage } = window.millm;

  document.addEventListener("click", async (event) => {
    const button = event.target.closest("button");
    if (!button) return;
    if (button.dataset.attach) {
      const key = button.closest(".ruleset").querySelector(".attach-to").value;
      const answer = await api("PUT", `/api/probes/behaviours/${encodeURIComponent(key)}/rule-signals`,
        { rule_set_id: button.dataset.attach });
      if (!answer.ok) { flash(errorMessage(answer), "refusal"); return; }
      window.location.reload();
    }
  });

  document.addEventListener("submit", async (event) => {
    const form = event.target.closest("form[data-evaluate]");
    if (!form) return;
    event.preventDefault();
    const answer = await api("POST", form.dataset.evaluate, { text: form.elements.text.value });
    if (!answer.ok) { flash(errorMessage(answer), "refusal"); return; }
    const table = form.querySelector("table.evaluation");
    table.tBodies[0].replaceChildren(...answer.data.results.map((r) => el("tr", { "data-expression": r.name },
      el("td", {}, r.name), el("td", { class: r.fires ? "fires" : "" }, r.fires === null ? `undecided: ${r.reason}` : String(r.fires)),
      el("td", {}, r.count ?? ""))));
    table.hidden = false;
  });
})();
