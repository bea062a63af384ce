/* Keyboard navigation, copy buttons and chart colours for the dark theme.
 *
 * Wired by data attributes only (the CSP allows no inline script):
 *   [data-nav-list] ... [data-nav-row]   j / k move (its tbody rows when none is marked),
 *                                        Enter opens the row's first link,
 *                                        x ticks the row's checkbox;
 *   the timeline's rounds (.timeline-main > section.round) move the same way;
 *   [data-search]                        "/" focuses it;
 *   button[data-copy]                    copies its value to the clipboard.
 */
(function () {
  "use strict";

  function rows() {
    var list = document.querySelector("[data-nav-list]");
    if (list) {
      var marked = list.querySelectorAll("[data-nav-row]");
      return Array.prototype.slice.call(marked.length ? marked : list.querySelectorAll("tbody > tr"));
    }
    return Array.prototype.slice.call(document.querySelectorAll(".timeline-main > section.round"));
  }

  function typing(target) {
    var tag = (target && target.tagName) || "";
    return tag === "INPUT" || tag === "TEXTAREA" || tag === "SELECT" || (target && target.isContentEditable);
  }

  function move(step) {
    var all = rows();
    if (!all.length) return;
    var current = all.findIndex(function (row) { return row.classList.contains("kbd-current"); });
    var next = current < 0 ? (step > 0 ? 0 : all.length - 1) : Math.min(all.length - 1, Math.max(0, current + step));
    if (current >= 0) all[current].classList.remove("kbd-current");
    all[next].classList.add("kbd-current");
    all[next].setAttribute("tabindex", "-1");
    all[next].focus({ preventScroll: true });
    all[next].scrollIntoView({ block: "nearest" });
  }

  function currentRow() {
    return document.querySelector(".kbd-current");
  }

  document.addEventListener("keydown", function (event) {
    if (event.ctrlKey || event.metaKey || event.altKey || typing(event.target)) return;
    if (event.key === "j" || event.key === "k") {
      event.preventDefault();
      move(event.key === "j" ? 1 : -1);
    } else if (event.key === "Enter") {
      var row = currentRow();
      var link = row && row.querySelector("a[href]");
      if (link) {
        event.preventDefault();
        window.location.assign(link.href);
      }
    } else if (event.key === "x") {
      var box = currentRow() && currentRow().querySelector("input[type=checkbox]");
      if (box) {
        event.preventDefault();
        box.checked = !box.checked;
      }
    } else if (event.key === "/") {
      var search = document.querySelector("[data-search]");
      if (search) {
        event.preventDefault();
        search.focus();
        search.select();
      }
    }
  });

  function copied(button) {
    button.classList.add("copied");
    button.textContent = "copied";
    window.setTimeout(function () {
      button.classList.remove("copied");
      button.textContent = "copy";
    }, 1500);
  }

  document.addEventListener("click", function (event) {
    var button = event.target.closest && event.target.closest("button[data-copy]");
    if (!button) return;
    event.preventDefault();
    var text = button.dataset.copy || "";
    if (navigator.clipboard && navigator.clipboard.writeText) {
      navigator.clipboard.writeText(text).then(function () { copied(button); }, function () {});
    }
  });

  // Chart.js draws text in its own default grey; follow the page's colours.
  function chartColors() {
    if (typeof window.Chart === "undefined") return;
    var style = window.getComputedStyle(document.documentElement);
    window.Chart.defaults.color = style.getPropertyValue("--muted").trim() || "#5c6675";
    window.Chart.defaults.borderColor = style.getPropertyValue("--line").trim() || "#d9dee6";
  }
  document.addEventListener("DOMContentLoaded", chartColors);
  window.observatoryChartColors = chartColors;
})();
