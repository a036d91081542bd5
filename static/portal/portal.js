// The portal's one script besides htmx; every page works without it.
// - Tells the server the browser's time zone (a cookie), for "times in your browser's zone".
// - Marks the page as scripted, so texts about live updates show only where they happen.
// - Submits the time-zone choice when it changes, and ticks every row for "select all on this page".
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
  document.addEventListener("change", function (e) {
    var el = e.target;
    if (el.matches("select[data-autosubmit]") && el.form) {
      el.form.requestSubmit();
    } else if (el.matches("input[data-select-all]")) {
      document.querySelectorAll(el.getAttribute("data-select-all")).forEach(function (box) { box.checked = el.checked; });
    }
  });
})();
