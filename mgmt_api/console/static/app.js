// meshplane console: the few behaviours htmx does not cover.
// - every htmx request carries the session's CSRF token (forms carry it too);
// - a lost connection or an expired session shows a banner that says so, and
//   the banner goes away once a request succeeds again.
// No inline script, no eval: the page's Content-Security-Policy forbids both.
"use strict";

(function () {
  function banner(text, kind, link) {
    var el = document.getElementById("banner");
    if (!el) { return; }
    el.textContent = text;
    el.className = "banner " + (kind || "");
    if (link) {
      var a = document.createElement("a");
      a.href = link.href;
      a.textContent = link.text;
      a.setAttribute("hx-boost", "false");
      el.appendChild(document.createTextNode(" "));
      el.appendChild(a);
    }
    el.hidden = !text;
  }

  var offline = false;

  document.addEventListener("htmx:configRequest", function (evt) {
    var meta = document.querySelector('meta[name="csrf-token"]');
    if (meta) { evt.detail.headers["X-CSRF-Token"] = meta.content; }
  });

  document.addEventListener("htmx:sendError", function (evt) {
    offline = true;
    var poll = evt.detail.elt && evt.detail.elt.id === "live-status";
    banner(poll
      ? "Lost the connection to the management plane. Retrying; the status below may be out of date."
      : "Lost the connection to the management plane: nothing was sent. Try again when the connection is back.",
      "bad");
  });

  document.addEventListener("htmx:responseError", function (evt) {
    var xhr = evt.detail.xhr;
    if (xhr && xhr.status === 401) {
      var login = xhr.getResponseHeader("x-console-login") || "/ui/login?expired=1";
      banner("Your session expired.", "bad", { href: login, text: "Sign in again" });
    }
  });

  document.addEventListener("htmx:afterRequest", function (evt) {
    var xhr = evt.detail.xhr;
    if (evt.detail.successful && offline) {
      offline = false;
      banner("Connection restored.", "ok");
      window.setTimeout(function () { if (!offline) { banner(""); } }, 3000);
    } else if (xhr && xhr.status === 401) {
      return;
    }
  });
})();
