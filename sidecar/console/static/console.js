// The console's only script: refreshes the page's figures every few seconds (the server
// renders them; this swaps <main>), pausable with the button or the "p" key. Without it,
// every page still reads and works (reload to refresh).
(function () {
  "use strict";
  var main = document.getElementById("page");
  var state = document.getElementById("live-state");
  if (!main || !main.dataset.refresh || !window.fetch || !window.DOMParser) { return; }
  var seconds = Number(main.dataset.refresh) || 5;
  var paused = false;
  var button = document.createElement("button");
  button.type = "button";
  button.id = "pause";
  state.parentNode.insertBefore(button, state);
  function show() {
    button.textContent = paused ? "resume refresh (p)" : "pause refresh (p)";
    button.setAttribute("aria-pressed", paused ? "true" : "false");
    state.textContent = paused ? "paused" : "live, every " + seconds + " s";
  }
  function refresh() {
    if (paused || document.hidden) { return; }
    fetch(window.location.href, { credentials: "same-origin", cache: "no-store" })
      .then(function (response) {
        if (!response.ok) { throw new Error(String(response.status)); }
        return response.text();
      })
      .then(function (text) {
        var fresh = new DOMParser().parseFromString(text, "text/html").getElementById("page");
        if (fresh && !paused) { main.replaceChildren.apply(main, Array.from(fresh.childNodes)); }
        show();
      })
      .catch(function (error) { state.textContent = "refresh failed (" + error.message + ")"; });
  }
  button.addEventListener("click", function () { paused = !paused; show(); });
  document.addEventListener("keydown", function (event) {
    var tag = (event.target && event.target.tagName) || "";
    if (event.key === "p" && tag !== "INPUT" && tag !== "SELECT" && tag !== "TEXTAREA") {
      paused = !paused; show();
    }
  });
  show();
  window.setInterval(refresh, seconds * 1000);
}());
