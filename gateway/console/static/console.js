// Loops console: refreshes the live parts of a page and applies the chart toggles.
// Every part is rendered on the server; this only fetches fresh HTML for elements that
// carry a data-live URL, every data-refresh-ms milliseconds while the tab is visible.
"use strict";
(function () {
  const every = Number(document.body.dataset.refreshMs) || 3000;

  async function refresh(el) {
    const url = el.dataset.live;
    if (!url) return;
    let resp;
    try {
      resp = await fetch(url, { credentials: "same-origin", cache: "no-store" });
    } catch (e) {
      el.classList.add("stale");
      return;
    }
    if (resp.redirected && new URL(resp.url).pathname === "/console/signin") {
      window.location = "/console/signin"; // the session ended
      return;
    }
    if (!resp.ok) {
      el.classList.add("stale");
      return;
    }
    const html = await resp.text();
    if (el.dataset.live !== url) return; // a toggle changed the URL meanwhile
    el.innerHTML = html;
    el.classList.remove("stale");
    el.dataset.refreshed = String(Number(el.dataset.refreshed || 0) + 1);
  }

  function refreshAll() {
    if (document.hidden) return;
    document.querySelectorAll("[data-live]").forEach(refresh);
  }
  setInterval(refreshAll, every);

  // Chart toggles: the live part's URL (and the page's, so a reload keeps them).
  const live = document.getElementById("run-live");
  function applyToggles() {
    const u = new URL(live.dataset.live, window.location.href);
    const page = new URL(window.location.href);
    for (const [id, key] of [["toggle-ema", "ema"], ["toggle-log", "log"]]) {
      const on = document.getElementById(id).checked;
      for (const x of [u, page]) {
        if (on) x.searchParams.set(key, "1");
        else x.searchParams.delete(key);
      }
    }
    live.dataset.live = u.pathname + u.search;
    history.replaceState(null, "", page.pathname + page.search);
    refresh(live);
  }
  if (live) {
    for (const id of ["toggle-ema", "toggle-log"]) {
      const box = document.getElementById(id);
      if (box) box.addEventListener("change", applyToggles);
    }
  }
})();
