// The console's only script: refreshes the page's figures (the server renders them; this
// swaps <main>) every data-refresh seconds, the next refresh only once the last one is
// done. Pausable with the button or the "p" key. It never swaps while the keyboard focus
// is inside the page or a filter was changed and not yet shown, so keyboard and screen
// reader users keep their place; a session that ended sends the browser to the login.
// Without this script every page still reads and works (reload to refresh).
(function () {
  "use strict";
  var main = document.getElementById("page");
  var state = document.getElementById("live-state");
  if (!main || !main.dataset.refresh || !window.fetch || !window.DOMParser) { return; }
  var seconds = Number(main.dataset.refresh) || 5;
  var paused = false;
  var edited = false;
  var button = document.createElement("button");
  button.type = "button";
  button.id = "pause";
  state.parentNode.insertBefore(button, state);
  function show(note) {
    button.textContent = paused ? "resume refresh (p)" : "pause refresh (p)";
    button.setAttribute("aria-pressed", paused ? "true" : "false");
    state.textContent = note || (paused ? "paused" : "live, every " + seconds + " s");
  }
  function busy() {
    var focused = document.activeElement;
    return edited || (focused && focused !== document.body && main.contains(focused));
  }
  function later() { window.setTimeout(refresh, seconds * 1000); }
  function refresh() {
    if (paused || document.hidden || busy()) {
      if (busy() && !paused) { show("held while you use the page"); }
      later();
      return;
    }
    var abort = new AbortController();
    var timer = window.setTimeout(function () { abort.abort(); }, 20000);
    fetch(window.location.href, { credentials: "same-origin", cache: "no-store",
                                  signal: abort.signal })
      .then(function (response) {
        if (!response.ok) { throw new Error(String(response.status)); }
        return response.text().then(function (text) { return [response, text]; });
      })
      .then(function (answer) {
        var fresh = new DOMParser().parseFromString(answer[1], "text/html")
          .getElementById("page");
        if (answer[0].redirected || !fresh || fresh.dataset.page !== main.dataset.page) {
          window.location.assign(answer[0].url);  // the session ended: the login page
          return;
        }
        if (!paused && !busy()) {
          main.replaceChildren.apply(main, Array.from(fresh.childNodes));
        }
        show();
        later();
      })
      .catch(function (error) {
        show("refresh failed (" + error.message + ")");
        later();
      })
      .finally(function () { window.clearTimeout(timer); });
  }
  main.addEventListener("change", function () { edited = true; });
  main.addEventListener("submit", function () { edited = false; });
  button.addEventListener("click", function () { paused = !paused; show(); });
  document.addEventListener("keydown", function (event) {
    var target = event.target || {};
    var tag = target.tagName || "";
    if (event.key === "p" && !event.ctrlKey && !event.metaKey && !event.altKey &&
        !target.isContentEditable && tag !== "INPUT" && tag !== "SELECT" &&
        tag !== "TEXTAREA") {
      paused = !paused; show();
    }
  });
  show();
  later();
}());
