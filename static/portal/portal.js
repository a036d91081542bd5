// The portal's one script besides htmx; every page works without it.
// - Tells the server the browser's time zone (a cookie), for "times in your browser's zone".
// - Marks the page as scripted, so texts about live updates show only where they happen.
// - Submits the time-zone choice when it changes, and ticks every row for "select all on this page".
// - Says so when an htmx request fails (a refused action, the database unavailable, no answer at
//   all): htmx swaps nothing then, so the page would look as if nothing happened, or stay stale.
(function () {
  var root = document.documentElement;
  root.classList.add("js");
  try {
    var zone = Intl.DateTimeFormat().resolvedOptions().timeZone;
    var cookie = "portal_browser_tz=" + zone;
    if (zone && /^[A-Za-z0-9_+\-\/]{1,64}$/.test(zone) && document.cookie.split("; ").indexOf(cookie) < 0) {
      document.cookie = cookie + "; path=/; max-age=31536000; samesite=lax";
      // The page was drawn in UTC for want of the zone: draw it again, once, now the server knows.
      if (root.getAttribute("data-tz-fallback") === "browser" && document.cookie.split("; ").indexOf(cookie) >= 0) {
        location.reload();
      }
    }
  } catch (e) { /* no Intl: times stay in UTC, as the page says */ }
  function requestNotice(text) {
    var el = document.getElementById("request-failed");
    var main = document.getElementById("main");
    if (!text || !main) {
      if (el) { el.remove(); }
      return;
    }
    if (!el) {
      el = document.createElement("p");
      el.id = "request-failed";
      el.className = "msg msg-error";
      el.setAttribute("role", "alert");
      main.insertBefore(el, main.firstChild);
    }
    el.textContent = text;
  }
  document.addEventListener("htmx:responseError", function (e) {
    var xhr = e.detail.xhr;
    requestNotice(xhr.status === 503
      ? "The database is unavailable (restarting or failing over): this page is not up to date, and the " +
        "action you sent, if any, may not have been done. Try again in a few seconds."
      : "The server answered " + xhr.status + (xhr.statusText ? " " + xhr.statusText : "") +
        ": nothing was changed on this page. Reload it to see the current state.");
  });
  document.addEventListener("htmx:sendError", function () {
    requestNotice("No answer from the server (the network or the server is down): this page is not up to " +
      "date, and the action you sent, if any, may not have been done. Try again in a few seconds.");
  });
  document.addEventListener("htmx:afterRequest", function (e) {
    if (e.detail.successful) { requestNotice(null); }
  });
  // The time-display form returns to the page it was on: to the address as it is now, with the
  // filters and page that htmx has put in it since the page was drawn.
  document.addEventListener("submit", function (e) {
    var next = e.target.matches("form.tzpref") && e.target.querySelector("input[name=next]");
    if (next) {
      next.value = location.pathname + location.search;
    }
  });
  document.addEventListener("change", function (e) {
    var el = e.target;
    if (el.matches("select[data-autosubmit]") && el.form) {
      el.form.requestSubmit();
    } else if (el.matches("input[data-select-all]")) {
      document.querySelectorAll(el.getAttribute("data-select-all")).forEach(function (box) { box.checked = el.checked; });
    }
  });
})();
