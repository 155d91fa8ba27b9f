/* Fit wide display equations to the text column (book/_static/math_fit.css has the layout).
 *
 * MathJax 3 does not break long display equations into lines (version 4 does), so an equation
 * wider than the column was cut at the column's edge beside its number. For each display
 * equation, after MathJax has typeset the page and its fonts have loaded, and again whenever the
 * column changes width:
 *   1. if it fits beside its number, nothing changes;
 *   2. else the number goes on its own line below it (the equation gets the full column);
 *   3. if it is still too wide, it is scaled down to the column's width, but never below
 *      MIN_SCALE of its size (MathJax already sets display math at ~127% of the text, so 0.6 is
 *      about 0.76 of the body text);
 *   4. past that, the equation keeps MIN_SCALE and scrolls horizontally inside its own box.
 * `window.bookMathFit` is a promise that resolves after the first pass (the render tests wait
 * for it). */
(function () {
  "use strict";
  const MIN_SCALE = 0.6;

  function fitOne(div) {
    const container = div.querySelector('mjx-container[display="true"]');
    const math = container && container.querySelector("mjx-math");
    if (!math) return;
    if (container.dataset.fitBase === undefined) container.dataset.fitBase = container.style.fontSize || "";
    // reset to MathJax's own size and the theme's layout, then measure
    container.style.fontSize = container.dataset.fitBase;
    div.classList.remove("math-number-below");
    const natural = math.getBoundingClientRect().width;
    if (natural <= container.clientWidth + 0.5) return;
    if (div.querySelector(".eqno")) div.classList.add("math-number-below");
    const room = container.clientWidth;
    if (natural <= room + 0.5) return;
    const base = parseFloat(container.dataset.fitBase) || 100; // MathJax's percentage of the text
    const scale = Math.max(MIN_SCALE, Math.floor((room / natural) * 1000) / 1000);
    container.style.fontSize = (base * scale).toFixed(2) + "%";
  }

  function fitAll() {
    document.querySelectorAll("div.math").forEach(fitOne);
  }

  let pending = null;
  let lastWidth = null;
  function refit() {
    const column = document.querySelector("article") || document.body;
    const width = column.clientWidth;
    if (width === lastWidth) return; // the fit depends on the width only (heights change as it fits)
    lastWidth = width;
    if (pending) cancelAnimationFrame(pending);
    pending = requestAnimationFrame(() => { pending = null; fitAll(); });
  }

  window.bookMathFit = new Promise((resolve) => {
    window.addEventListener("load", () => {
      const mj = window.MathJax;
      if (!(mj && mj.startup && mj.startup.promise)) { resolve(false); return; }
      mj.startup.promise
        .then(() => document.fonts.ready)
        .then(() => {
          fitAll();
          lastWidth = (document.querySelector("article") || document.body).clientWidth;
          const column = document.querySelector("article") || document.body;
          if (window.ResizeObserver) new ResizeObserver(refit).observe(column);
          else window.addEventListener("resize", refit);
          resolve(true);
        })
        .catch(() => resolve(false));
    });
  });
})();
