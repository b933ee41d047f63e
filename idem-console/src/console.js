// idem console: a little progressive enhancement. Every page works
// without it.
"use strict";
document.addEventListener("DOMContentLoaded", () => {
  // A list's filters apply as soon as a choice is made.
  for (const select of document.querySelectorAll("form.filters select, form.filters input[type=checkbox]")) {
    select.addEventListener("change", () => select.form.requestSubmit());
  }
  // A confirmation is sent once: a second click while the first is on its
  // way would only be refused (the fence has moved), but says nothing new.
  for (const form of document.querySelectorAll("form.resolve")) {
    form.addEventListener("submit", () => {
      for (const button of form.querySelectorAll("button[type=submit]")) button.disabled = true;
    });
  }
});
// Back to a confirmation from the browser's cache: its button works again
// (the server refuses a resolution that no longer applies, saying why).
window.addEventListener("pageshow", (event) => {
  if (!event.persisted) return;
  for (const button of document.querySelectorAll("form.resolve button[type=submit]")) button.disabled = false;
});
