// The "Explore" controls on the static site (issue 16): say that they need a kernel and link to
// this chapter on Binder and Colab (the page's own launch links), and, where the explorer carries
// its settings for the calculator (parmem.book.widgets.base.explorer(calculator=...)), to the
// in-browser calculator with those settings (issue 17). See explore.css.
(function () {
  "use strict";
  function launchLinks() {
    const find = (part) => document.querySelector(`a[href*="${part}"]`);
    const links = [];
    const binder = find("mybinder.org");
    const colab = find("colab.research.google.com");
    if (binder) links.push(`<a href="${binder.href}">Binder</a>`);
    if (colab) links.push(`<a href="${colab.href}">Colab</a>`);
    return links.length ? links.join(" or ") : "Binder or Colab (the rocket icon above)";
  }
  function calculatorLink(box) {
    const carried = box.querySelector(".parmem-calc-query");
    if (!carried) return "";
    const root = document.documentElement.dataset.content_root || "";
    const query = carried.textContent.trim();
    const href = `${root}chapters/tools/calculator.html${query ? "?" + query : ""}`;
    return ` Or open these settings in the <a class="parmem-calculator-link" href="${href}">` +
      "memory calculator</a>, which runs parmem in this page, no kernel needed.";
  }
  function annotate() {
    document.querySelectorAll(".parmem-explorer").forEach((box) => {
      const host = box.closest(".cell_output") || box.parentElement;
      if (!host || host.querySelector(".parmem-static-note")) return;
      const note = document.createElement("p");
      note.className = "parmem-static-note";
      note.innerHTML = "These controls are inactive on this page: they need a running kernel. " +
        `Run this chapter live on ${launchLinks()}; the figure below is the default setting, ` +
        "computed when the book was built." + calculatorLink(box);
      host.insertBefore(note, host.firstChild);
    });
  }
  function start() {
    annotate();
    new MutationObserver(annotate).observe(document.body, { childList: true, subtree: true });
  }
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start);
  else start();
})();
