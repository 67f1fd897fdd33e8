// The chat page: conversations in localStorage, replies streamed from the server's own
// /v1/chat/completions (SSE), rendered as Markdown while they arrive. Every URL is relative,
// so the page works under a proxy prefix (--root-path).
"use strict";

(function () {
  const markdown = window.LlmpMarkdown;
  const STORE = {
    conversations: "llmp.webui.conversations",
    current: "llmp.webui.current",
    settings: "llmp.webui.settings",
    apiKey: "llmp.webui.apiKey",
  };
  const NEW_TITLE = "New chat";
  const $ = (id) => document.getElementById(id);
  const ui = {
    sidebar: $("sidebar"),
    conversations: $("conversations"),
    newChat: $("new-chat"),
    openSidebar: $("open-sidebar"),
    closeSidebar: $("close-sidebar"),
    model: $("model"),
    toggleSettings: $("toggle-settings"),
    settings: $("settings"),
    system: $("system-prompt"),
    temperature: $("temperature"),
    maxTokens: $("max-tokens"),
    forgetKey: $("forget-key"),
    messages: $("messages"),
    emptyHint: $("empty-hint"),
    composer: $("composer"),
    prompt: $("prompt"),
    send: $("send"),
    stop: $("stop"),
    keyDialog: $("key-dialog"),
    keyForm: $("key-form"),
    keyReason: $("key-reason"),
    keyInput: $("api-key"),
    keyCancel: $("key-cancel"),
  };

  const state = {
    config: {},
    conversations: load(STORE.conversations, []),
    currentId: load(STORE.current, null),
    settings: { system: "", temperature: "", maxTokens: "", model: "", ...load(STORE.settings, {}) },
    streaming: null, // {controller, reply, view} while a reply arrives
  };

  // -- storage ----------------------------------------------------------------------

  function load(key, fallback) {
    try {
      const text = localStorage.getItem(key);
      return text === null ? fallback : JSON.parse(text);
    } catch {
      return fallback;
    }
  }

  function save(key, value) {
    try {
      localStorage.setItem(key, JSON.stringify(value));
    } catch {
      // storage full or refused (private mode): the page keeps working from memory
    }
  }

  function persist() {
    save(STORE.conversations, state.conversations);
    save(STORE.current, state.currentId);
  }

  function saveSettings() {
    save(STORE.settings, state.settings);
  }

  // -- the server ---------------------------------------------------------------------

  class ServerError extends Error {}

  let keyRequest = null; // one dialog for every call refused at once

  function askForKey(reason) {
    if (keyRequest) return keyRequest;
    keyRequest = new Promise((resolve) => {
      ui.keyReason.textContent = reason;
      ui.keyInput.value = "";
      const finish = (saved) => {
        ui.keyForm.removeEventListener("submit", onSubmit);
        ui.keyCancel.removeEventListener("click", onCancel);
        ui.keyDialog.removeEventListener("cancel", onCancel);
        if (ui.keyDialog.open) ui.keyDialog.close();
        keyRequest = null;
        updateKeyButton();
        resolve(saved);
        ui.prompt.focus();
      };
      const onSubmit = (event) => {
        event.preventDefault();
        const key = ui.keyInput.value.trim();
        if (!key) return;
        save(STORE.apiKey, key);
        finish(true);
      };
      const onCancel = (event) => {
        event.preventDefault();
        finish(false);
      };
      ui.keyForm.addEventListener("submit", onSubmit);
      ui.keyCancel.addEventListener("click", onCancel);
      ui.keyDialog.addEventListener("cancel", onCancel);
      ui.keyDialog.showModal();
      ui.keyInput.focus();
    });
    return keyRequest;
  }

  // fetch `path` (relative to the page) with the stored key; a 401 asks for a key and retries
  async function api(path, init = {}) {
    for (;;) {
      const key = load(STORE.apiKey, "");
      const headers = { ...(init.headers || {}) };
      if (key) headers.Authorization = `Bearer ${key}`;
      const response = await fetch(path, { ...init, headers });
      if (response.status !== 401) return response;
      const reason = key
        ? "The server refused the stored API key: enter the right one."
        : "This server needs an API key (llmp serve --api-key).";
      if (!(await askForKey(reason))) return response;
    }
  }

  async function errorText(response) {
    const text = await response.text();
    let message = text;
    try {
      const body = JSON.parse(text);
      message = body.error?.message || body.error || body.detail || text;
      if (typeof message !== "string") message = JSON.stringify(message);
    } catch {
      // not JSON: the text as it came
    }
    return `${response.status} ${response.statusText}: ${message}`.replace(/ {2,}/g, " ");
  }

  // the data of each server-sent event of a response, as parsed JSON, until [DONE]
  async function* events(response) {
    const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
    let buffer = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return;
      buffer += value;
      let end;
      while ((end = /\r?\n\r?\n/.exec(buffer))) {
        const block = buffer.slice(0, end.index);
        buffer = buffer.slice(end.index + end[0].length);
        const data = block
          .split(/\r?\n/)
          .filter((line) => line.startsWith("data:"))
          .map((line) => line.slice(5).replace(/^ /, ""))
          .join("\n");
        if (!data) continue;
        if (data === "[DONE]") return;
        yield JSON.parse(data);
      }
    }
  }

  async function loadConfig() {
    try {
      const response = await fetch("webui/config.json");
      if (response.ok) state.config = await response.json();
    } catch {
      // the page still works with what /v1/models says
    }
    if (state.config.max_model_len) ui.maxTokens.max = String(state.config.max_model_len);
  }

  async function loadModels() {
    let names = state.config.models || (state.config.model ? [state.config.model] : []);
    try {
      const response = await api("v1/models");
      if (response.ok) names = (await response.json()).data.map((model) => model.id);
    } catch {
      // offline for a moment: keep the names from config.json
    }
    ui.model.replaceChildren(
      ...names.map((name) => {
        const option = document.createElement("option");
        option.value = option.textContent = name;
        return option;
      })
    );
    if (names.includes(state.settings.model)) ui.model.value = state.settings.model;
  }

  // -- conversations --------------------------------------------------------------------

  function current() {
    return state.conversations.find((c) => c.id === state.currentId) || null;
  }

  function newConversation() {
    const conversation = { id: `c${Date.now().toString(36)}${Math.random().toString(36).slice(2, 6)}`, title: NEW_TITLE, messages: [] };
    state.conversations.unshift(conversation);
    state.currentId = conversation.id;
    persist();
    return conversation;
  }

  function selectConversation(id) {
    if (state.streaming) stop();
    state.currentId = id;
    persist();
    renderAll();
    closeSidebar();
    ui.prompt.focus();
  }

  function deleteConversation(id) {
    if (state.streaming && current()?.id === id) stop();
    state.conversations = state.conversations.filter((c) => c.id !== id);
    if (state.currentId === id) state.currentId = state.conversations[0]?.id || null;
    persist();
    renderAll();
  }

  // what the model is sent: the system prompt, then each turn that has text
  function requestMessages(conversation) {
    const messages = [];
    if (state.settings.system.trim()) messages.push({ role: "system", content: state.settings.system });
    for (const message of conversation.messages) {
      if (message.content) messages.push({ role: message.role, content: message.content });
    }
    return messages;
  }

  function requestBody(conversation) {
    const body = { model: ui.model.value || undefined, messages: requestMessages(conversation), stream: true };
    body.stream_options = { include_usage: true };
    const temperature = parseFloat(state.settings.temperature);
    if (Number.isFinite(temperature)) body.temperature = temperature;
    const maxTokens = parseInt(state.settings.maxTokens, 10);
    if (Number.isFinite(maxTokens) && maxTokens > 0) body.max_tokens = maxTokens;
    return body;
  }

  async function send(text) {
    if (state.streaming || !text.trim()) return;
    const conversation = current() || newConversation();
    if (conversation.title === NEW_TITLE) conversation.title = text.trim().split("\n")[0].slice(0, 60);
    conversation.messages.push({ role: "user", content: text });
    const body = requestBody(conversation);
    const reply = { role: "assistant", content: "", reasoning: "", model: body.model || "" };
    conversation.messages.push(reply);
    persist();
    renderAll();
    const view = ui.messages.lastElementChild.view;
    const controller = new AbortController();
    state.streaming = { controller, reply, view };
    setStreaming(true);
    const started = performance.now();
    let firstToken = 0;
    try {
      const response = await api("v1/chat/completions", {
        method: "POST",
        headers: { "Content-Type": "application/json" },
        body: JSON.stringify(body),
        signal: controller.signal,
      });
      if (!response.ok) throw new ServerError(await errorText(response));
      for await (const event of events(response)) {
        if (event.error) throw new ServerError(event.error.message || JSON.stringify(event.error));
        if (event.model && !reply.model) reply.model = event.model; // the name asked for, else the server's
        const delta = event.choices?.[0]?.delta || {};
        const reasoning = delta.reasoning ?? delta.reasoning_content;
        if (reasoning || delta.content) firstToken ||= performance.now();
        if (reasoning) reply.reasoning += reasoning;
        if (delta.content) reply.content += delta.content;
        if (event.choices?.[0]?.finish_reason) reply.finish = event.choices[0].finish_reason;
        if (event.usage) {
          const seconds = (performance.now() - (firstToken || started)) / 1000;
          reply.tokens = event.usage.completion_tokens;
          if (seconds > 0 && reply.tokens > 1) reply.speed = (reply.tokens - 1) / seconds;
        }
        scheduleUpdate();
      }
    } catch (error) {
      if (error.name === "AbortError") reply.stopped = true;
      else if (error instanceof ServerError) reply.error = error.message;
      else reply.error = `Could not reach the server: ${error.message}`;
    } finally {
      state.streaming = null;
      persist();
      updateReply(view, reply, false);
      setStreaming(false);
    }
  }

  function stop() {
    if (state.streaming) state.streaming.controller.abort();
  }

  // -- rendering ---------------------------------------------------------------------------

  let updatePending = false;

  function scheduleUpdate() {
    if (updatePending) return;
    updatePending = true;
    const run = () => {
      updatePending = false;
      if (state.streaming) updateReply(state.streaming.view, state.streaming.reply, true);
    };
    if (document.hidden) setTimeout(run, 100);
    else requestAnimationFrame(run);
  }

  function nearBottom() {
    const box = ui.messages;
    return box.scrollHeight - box.scrollTop - box.clientHeight < 80;
  }

  function element(tag, className, text) {
    const node = document.createElement(tag);
    if (className) node.className = className;
    if (text !== undefined) node.textContent = text;
    return node;
  }

  function messageView(message) {
    const article = element("article", `message ${message.role}`);
    article.setAttribute("aria-label", message.role === "user" ? "You" : "Assistant");
    if (message.role === "user") {
      article.append(element("div", "content plain", message.content));
      return article;
    }
    const view = {
      article,
      reasoning: null,
      reasoningBody: null,
      content: element("div", "content markdown"),
      error: element("p", "error"),
      meta: element("p", "meta"),
    };
    view.error.setAttribute("role", "alert");
    article.append(view.content, view.error, view.meta);
    article.view = view;
    updateReply(view, message, false);
    return article;
  }

  function updateReply(view, message, streaming) {
    const follow = nearBottom();
    if (message.reasoning && !view.reasoning) {
      view.reasoning = element("details", "reasoning");
      view.reasoning.append(element("summary", "", "Reasoning"));
      view.reasoningBody = element("div", "markdown");
      view.reasoning.append(view.reasoningBody);
      view.article.prepend(view.reasoning);
    }
    if (view.reasoning) {
      view.reasoning.querySelector("summary").textContent =
        streaming && !message.content ? "Reasoning…" : "Reasoning";
      view.reasoningBody.innerHTML = markdown.render(message.reasoning);
    }
    view.content.innerHTML = markdown.render(message.content);
    view.article.setAttribute("aria-busy", streaming ? "true" : "false");
    view.article.classList.toggle("streaming", streaming);
    view.error.textContent = message.error || "";
    view.error.hidden = !message.error;
    const facts = [];
    if (message.model) facts.push(message.model);
    if (message.tokens) facts.push(`${message.tokens} tokens`);
    if (message.speed) facts.push(`${message.speed.toFixed(1)} tokens/s`);
    if (message.stopped) facts.push("stopped");
    else if (message.finish === "length") facts.push("cut at the token limit");
    view.meta.textContent = streaming ? "" : facts.join(" · ");
    if (follow) ui.messages.scrollTop = ui.messages.scrollHeight;
  }

  function renderConversationList() {
    ui.conversations.replaceChildren(
      ...state.conversations.map((conversation) => {
        const item = element("li", "conversation");
        const open = element("button", "conversation-open", conversation.title);
        open.type = "button";
        if (conversation.id === state.currentId) open.setAttribute("aria-current", "true");
        open.addEventListener("click", () => selectConversation(conversation.id));
        const remove = element("button", "conversation-delete icon-button", "×");
        remove.type = "button";
        remove.setAttribute("aria-label", `Delete the conversation “${conversation.title}”`);
        remove.title = "Delete";
        remove.addEventListener("click", () => deleteConversation(conversation.id));
        item.append(open, remove);
        return item;
      })
    );
  }

  function renderAll() {
    renderConversationList();
    const conversation = current();
    const messages = conversation ? conversation.messages : [];
    ui.messages.replaceChildren(...(messages.length ? messages.map(messageView) : [ui.emptyHint]));
    ui.messages.scrollTop = ui.messages.scrollHeight;
  }

  function setStreaming(on) {
    ui.send.hidden = on;
    ui.stop.hidden = !on;
    ui.composer.classList.toggle("busy", on);
    if (!on && document.activeElement === document.body) ui.prompt.focus();
  }

  function updateKeyButton() {
    ui.forgetKey.hidden = !load(STORE.apiKey, "");
  }

  function openSidebar() {
    ui.sidebar.classList.add("open");
    ui.openSidebar.setAttribute("aria-expanded", "true");
    ui.newChat.focus();
  }

  function closeSidebar() {
    if (!ui.sidebar.classList.contains("open")) return;
    ui.sidebar.classList.remove("open");
    ui.openSidebar.setAttribute("aria-expanded", "false");
  }

  function growPrompt() {
    ui.prompt.style.height = "auto";
    ui.prompt.style.height = `${Math.min(ui.prompt.scrollHeight, 200)}px`;
  }

  async function copyCode(button) {
    const code = button.closest(".code").querySelector("code").textContent;
    try {
      await navigator.clipboard.writeText(code);
    } catch {
      // no clipboard API (a plain-http page): copy through a selection
      const area = element("textarea");
      area.value = code;
      document.body.append(area);
      area.select();
      document.execCommand("copy");
      area.remove();
    }
    button.textContent = "Copied";
    setTimeout(() => (button.textContent = "Copy"), 1500);
  }

  // -- wiring -----------------------------------------------------------------------------

  function wire() {
    ui.composer.addEventListener("submit", (event) => {
      event.preventDefault();
      const text = ui.prompt.value;
      if (!text.trim() || state.streaming) return;
      ui.prompt.value = "";
      growPrompt();
      send(text);
    });
    ui.prompt.addEventListener("keydown", (event) => {
      if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
        event.preventDefault();
        ui.composer.requestSubmit();
      }
    });
    ui.prompt.addEventListener("input", growPrompt);
    document.addEventListener("keydown", (event) => {
      if (event.key === "Escape" && state.streaming && !ui.keyDialog.open) {
        event.preventDefault();
        stop();
      } else if (event.key === "Escape") closeSidebar();
    });
    ui.stop.addEventListener("click", () => {
      stop();
      ui.prompt.focus();
    });
    ui.newChat.addEventListener("click", () => {
      if (state.streaming) stop();
      const conversation = current();
      if (!conversation || conversation.messages.length) newConversation();
      renderAll();
      closeSidebar();
      ui.prompt.focus();
    });
    ui.openSidebar.addEventListener("click", openSidebar);
    ui.closeSidebar.addEventListener("click", () => {
      closeSidebar();
      ui.openSidebar.focus();
    });
    ui.toggleSettings.addEventListener("click", () => {
      ui.settings.hidden = !ui.settings.hidden;
      ui.toggleSettings.setAttribute("aria-expanded", String(!ui.settings.hidden));
      if (!ui.settings.hidden) ui.system.focus();
    });
    ui.model.addEventListener("change", () => {
      state.settings.model = ui.model.value;
      saveSettings();
    });
    for (const [input, key] of [
      [ui.system, "system"],
      [ui.temperature, "temperature"],
      [ui.maxTokens, "maxTokens"],
    ]) {
      input.value = state.settings[key];
      input.addEventListener("input", () => {
        state.settings[key] = input.value;
        saveSettings();
      });
    }
    ui.forgetKey.addEventListener("click", () => {
      localStorage.removeItem(STORE.apiKey);
      updateKeyButton();
    });
    ui.messages.addEventListener("click", (event) => {
      const button = event.target.closest(".copy-code");
      if (button) copyCode(button);
    });
    // a reload while a reply arrives keeps what came so far (else storage is already up to date,
    // and writing this page's copy back could undo what another tab stored)
    window.addEventListener("pagehide", () => state.streaming && persist());
  }

  async function start() {
    wire();
    updateKeyButton();
    renderAll();
    await loadConfig();
    await loadModels();
    document.body.dataset.ready = "true"; // for tests and scripts: the model list is in
  }

  start();
})();
