// Steering: register an SAE, import its feature labels, set live values, save them as a profile.
"use strict";

(() => {
  const { api, flash, errorMessage } = window.millm;

  function parseFeatures(text) {
    return text.split(",").map((part) => part.trim()).filter(Boolean).map((part) => {
      const [index, strength] = part.split(":").map((x) => x.trim());
      return { index: Number(index), strength: Number(strength) };
    });
  }

  async function send(method, url, body) {
    const answer = await api(method, url, body);
    if (!answer.ok) { flash(errorMessage(answer), "refusal"); return; }
    window.location.reload();
  }

  async function importLabels(form) {
    const body = { mode: form.elements.mode.value };
    const file = form.elements.file.files[0];
    if (file) body.content = await file.text();
    else body.path = form.elements.path.value;
    const url = `/api/saes/${encodeURIComponent(form.elements.sae_id.value)}/labels`;
    const answer = await api("POST", url, body);
    if (!answer.ok) { flash(errorMessage(answer), "refusal"); return; }
    window.location.reload();
  }

  document.addEventListener("submit", (event) => {
    const form = event.target;
    if (form.id === "register-sae") {
      event.preventDefault();
      const body = { path: form.elements.path.value };
      if (form.elements.sae_id.value) body.sae_id = form.elements.sae_id.value;
      send("POST", "/api/saes", body);
    } else if (form.id === "set-steering") {
      event.preventDefault();
      send("PUT", "/api/steering", { sae_id: form.elements.sae_id.value, features: parseFeatures(form.elements.features.value) });
    } else if (form.id === "import-labels") {
      event.preventDefault();
      importLabels(form);
    } else if (form.id === "save-profile") {
      event.preventDefault();
      const live = document.getElementById("set-steering");
      send("POST", "/api/profiles", {
        name: form.elements.name.value, sae_id: live.elements.sae_id.value,
        features: parseFeatures(live.elements.features.value),
      });
    }
  });
})();
