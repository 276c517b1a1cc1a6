// Probe Monitors → Browse Hub: search Hugging Face for repos tagged mistudio-probe-definition, open one,
// import a single definition. Every call is on this server's API (/api/probes/hub/…), which reads
// the Hub anonymously; what the Hub says is set only as text.
"use strict";

(() => {
  const { api, el, errorMessage } = window.millm;
  const box = document.getElementById("browse-hub");
  if (!box) return;
  const repos = document.getElementById("hub-repos");
  const problem = document.getElementById("hub-error");

  function refuse(answer) {
    const error = answer.data && answer.data.error;
    problem.textContent = error && error.code ? `${errorMessage(answer)} [${error.code}]` : errorMessage(answer);
  }

  function rungWords(definition) {
    // An absent rung is said to be absent, never shown as 0: rung 0 is a claim ("trained").
    return definition.rung_stated ? `rung ${definition.rung}: ${definition.rung_language}` : "rung not stated";
  }

  function manifestWords(listing) {
    const manifest = listing.manifest || {};
    if (manifest.status === "found") return "Rungs as the repo's manifest states them.";
    if (manifest.status === "invalid") return `The repo's manifest could not be read (${manifest.reason}): no rung is stated.`;
    return "The repo has no manifest: no rung is stated.";
  }

  async function open(item, repoId) {
    const place = item.querySelector(".hub-definitions");
    if (place.dataset.open) { delete place.dataset.open; place.replaceChildren(); return; }
    place.dataset.open = "1";
    place.replaceChildren(el("p", { class: "note" }, "Reading the repo…"));
    const answer = await api("GET", `/api/probes/hub/definitions?repo_id=${encodeURIComponent(repoId)}`);
    if (!answer.ok) { place.replaceChildren(); delete place.dataset.open; refuse(answer); return; }
    const listing = answer.data;
    const rows = listing.data.map((d) => el("tr", { "data-filename": d.filename },
      el("td", {}, el("code", {}, d.filename)),
      el("td", { class: "rung" }, rungWords(d)),
      el("td", {}, d.size === null ? "" : `${d.size} bytes`),
      el("td", {}, el("button", { type: "button", "data-hub-import": d.filename }, "Import"))));
    place.replaceChildren(
      el("p", { class: "manifest" }, manifestWords(listing)),
      rows.length
        ? el("table", { class: "hub-files", "data-revision": listing.revision || "" }, el("tbody", {}, ...rows))
        : el("p", {}, "No .probe.json files in this repo."));
  }

  async function importOne(item, button) {
    const table = button.closest("table");
    const body = { repo_id: item.dataset.repo, filename: button.dataset.hubImport };
    if (table.dataset.revision) body.revision = table.dataset.revision; // the commit that was listed
    button.disabled = true;
    problem.textContent = "";
    try {
      const answer = await api("POST", "/api/probes/hub/import", body);
      if (!answer.ok) { refuse(answer); return; }
      window.location.reload();
    } finally {
      button.disabled = false;
    }
  }

  document.getElementById("hub-search").addEventListener("submit", async (event) => {
    event.preventDefault();
    problem.textContent = "";
    const q = event.target.elements.q.value.trim();
    repos.replaceChildren(el("li", { class: "note" }, "Searching…"));
    const answer = await api("GET", `/api/probes/hub/search${q ? "?q=" + encodeURIComponent(q) : ""}`);
    if (!answer.ok) { repos.replaceChildren(); refuse(answer); return; }
    if (!answer.data.data.length) {
      repos.replaceChildren(el("li", {}, `No repos tagged ${answer.data.tag} matched.`));
      return;
    }
    repos.replaceChildren(...answer.data.data.map((repo) => el("li", { "data-repo": repo.repo_id },
      el("button", { type: "button", class: "link hub-open" }, repo.repo_id),
      el("span", { class: "muted" }, ` · ${repo.downloads ?? "?"} downloads · ${repo.likes ?? "?"} likes`),
      el("div", { class: "hub-definitions" }))));
  });

  repos.addEventListener("click", (event) => {
    const button = event.target.closest("button");
    const item = button && button.closest("li[data-repo]");
    if (!item) return;
    if (button.classList.contains("hub-open")) open(item, item.dataset.repo);
    else if (button.dataset.hubImport) importOne(item, button);
  });
})();
