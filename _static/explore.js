// The "Explore" controls on the static site (issue 16): say that they need a kernel and link to
// this chapter on Binder and Colab (the page's own launch links), and, where the explorer carries
// its settings for the calculator (parmem.book.widgets.base.explorer(calculator=...)), to the
// in-browser calculator with those settings (issue 17). See explore.css.
// The note is in the page's language: Chinese in the Chinese edition (<html lang="zh-CN">).
(function () {
  "use strict";
  const TEXT = {
    en: {
      or: " or ",
      noLinks: "Binder or Colab (the rocket icon above)",
      note: (links) => "These controls are inactive on this page: they need a running kernel. " +
        `Run this chapter live on ${links}; the figure below is the default setting, ` +
        "computed when the book was built.",
      calculator: (href) => ` Or open these settings in the <a class="parmem-calculator-link" ` +
        `href="${href}">memory calculator</a>, which runs parmem in this page, no kernel needed.`,
    },
    zh: {
      or: " 或 ",
      noLinks: "Binder 或 Colab（上方的火箭图标）",
      note: (links) => "这些控件在本页上不可用：它们需要一个运行中的内核。" +
        `请在 ${links} 上实时运行本章；下图是默认设置下的结果，在构建本书时计算得出。`,
      calculator: (href) => `也可以在<a class="parmem-calculator-link" href="${href}">` +
        "显存计算器</a>中打开这些设置：它在本页中运行 parmem，无需内核。",
    },
  };
  const text = (document.documentElement.lang || "").startsWith("zh") ? TEXT.zh : TEXT.en;
  function launchLinks() {
    const find = (part) => document.querySelector(`a[href*="${part}"]`);
    const links = [];
    const binder = find("mybinder.org");
    const colab = find("colab.research.google.com");
    if (binder) links.push(`<a href="${binder.href}">Binder</a>`);
    if (colab) links.push(`<a href="${colab.href}">Colab</a>`);
    return links.length ? links.join(text.or) : text.noLinks;
  }
  function calculatorLink(box) {
    const carried = box.querySelector(".parmem-calc-query");
    if (!carried) return "";
    const root = document.documentElement.dataset.content_root || "";
    const query = carried.textContent.trim();
    return text.calculator(`${root}chapters/tools/calculator.html${query ? "?" + query : ""}`);
  }
  function annotate() {
    document.querySelectorAll(".parmem-explorer").forEach((box) => {
      const host = box.closest(".cell_output") || box.parentElement;
      if (!host || host.querySelector(".parmem-static-note")) return;
      const note = document.createElement("p");
      note.className = "parmem-static-note";
      note.innerHTML = text.note(launchLinks()) + calculatorLink(box);
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
