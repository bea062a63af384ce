/* Scoring by keyboard, and the scores summary's charts.
 *
 * Wired by data attributes only (the CSP allows no inline script):
 *   on the timeline, the round moved to with j / k (workflows.js marks it
 *   .kbd-current), or else the page's conversation:
 *     +  thumbs up       (its [data-score-up] button)
 *     -  thumbs down     (its [data-score-down] button)
 *     c  comment         (focuses its [data-score-comment] field; Enter saves)
 *   on a review item:
 *     n  reviewed, next ([data-review-done], else [data-review-next])
 *     s  skip           ([data-review-skip])
 *   canvas[data-chart="score-series"]   count and mean of a score name per bucket
 *                                        (drawn by observatory.js; a click drills down).
 */
(function () {
  "use strict";

  function typing(target) {
    var tag = (target && target.tagName) || "";
    return tag === "INPUT" || tag === "TEXTAREA" || tag === "SELECT" || (target && target.isContentEditable);
  }

  function widget() {
    var current = document.querySelector(".kbd-current");
    // The round's own scores (its tool calls have theirs inside it), else the conversation's.
    var found = current && current.querySelector(":scope > [data-scores]");
    return found || document.querySelector("[data-scores]");
  }

  document.addEventListener("keydown", function (event) {
    if (event.ctrlKey || event.metaKey || event.altKey || typing(event.target)) return;
    var review = { n: "[data-review-done], [data-review-next]", s: "[data-review-skip]" }[event.key];
    if (review) {
      var button = document.querySelector(review);
      if (button) {
        event.preventDefault();
        button.click();
      }
      return;
    }
    var selector = { "+": "[data-score-up]", "=": "[data-score-up]", "-": "[data-score-down]",
                     c: "[data-score-comment]" }[event.key];
    if (!selector) return;
    var scores = widget();
    var control = scores && scores.querySelector(selector);
    if (!control) return;
    event.preventDefault();
    if (control.tagName === "BUTTON") control.click();
    else control.focus();
  });

  var charts = window.observatoryCharts;
  if (charts) {
    charts.kinds["score-series"] = function (data) {
      return charts.barsAndLines(data, "scores", "mean", [
        { label: "scores", data: data.counts, backgroundColor: charts.colors.bar },
        { label: "mean", data: data.means, type: "line", spanGaps: true,
          borderColor: charts.colors.ok, backgroundColor: charts.colors.ok },
      ]);
    };
  }
})();
