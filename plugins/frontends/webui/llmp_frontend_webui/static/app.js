// The chat page: each conversation its own localStorage record, replies streamed from the
// server's own /v1/chat/completions (SSE), rendered as Markdown while they arrive. Every URL is
// relative, so the page works under a proxy prefix (--root-path).
"use strict";

(function () {
  const markdown = window.LlmpMarkdown;
  const STORE = {
    chatPrefix: "llmp.webui.chat.", // + id: one record per conversation, so tabs never overwrite each other
    current: "llmp.webui.current",
    settings: "llmp.webui.settings",
    apiKey: "llmp.webui.apiKey",
  };
  const NEW_TITLE = "New chat";
  const SAVE_EVERY_MS = 2000; // while a reply streams: a crashed tab keeps most of it
  const $ = (id) => document.getElementById(id);
  const ui = {
    sidebar: $("sidebar"),
    backdrop: $("backdrop"),
    main: $("main"),
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
    announcer: $("announcer"),
    notice: $("notice"),
    noticeText: $("notice-text"),
    noticeDismiss: $("notice-dismiss"),
    composer: $("composer"),
    prompt: $("prompt"),
    send: $("send"),
    stop: $("stop"),
    keyDialog: $("key-dialog"),
    keyForm: $("key-form"),
    keyReason: $("key-reason"),
    keyInput: $("api-key"),
    keyCancel: $("key-cancel"),
    deleteDialog: $("delete-dialog"),
    deleteText: $("delete-text"),
    deleteForm: $("delete-form"),
    deleteCancel: $("delete-cancel"),
  };

  const state = {
    config: {},
    models: [], // /v1/models data
    conversations: new Map(), // id -> {id, title, system, created, updated, messages}
    currentId: sessionStorage.getItem(STORE.current) || load(STORE.current, null),
    settings: { system: "", temperature: "", maxTokens: "", model: "", ...load(STORE.settings, {}) },
    streaming: null, // {controller, conversation, reply, view, savedAt} while a reply arrives
    leaving: false, // the page is being reloaded or closed: a cut reply is a stopped one
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

  // whether `value` was stored; a refusal (storage full, private mode) is told, never swallowed
  function save(key, value, what) {
    try {
      localStorage.setItem(key, JSON.stringify(value));
      return true;
    } catch {
      showNotice(`${what} could not be saved: this browser's storage for the page is full. Delete old chats to make room.`);
      return false;
    }
  }

  function loadConversations() {
    state.conversations.clear();
    for (let k = 0; k < localStorage.length; k++) {
      const key = localStorage.key(k);
      if (!key.startsWith(STORE.chatPrefix)) continue;
      const conversation = load(key, null);
      if (conversation?.messages) state.conversations.set(conversation.id, conversation);
    }
  }

  function saveConversation(conversation) {
    return save(STORE.chatPrefix + conversation.id, conversation, "The reply");
  }

  function rememberCurrent() {
    sessionStorage.setItem(STORE.current, state.currentId || ""); // this tab, across its reloads
    try {
      localStorage.setItem(STORE.current, JSON.stringify(state.currentId)); // a new tab opens it
    } catch {
      // full: a new tab opens the newest chat instead
    }
  }

  function saveSettings() {
    save(STORE.settings, state.settings, "The settings");
  }

  // another tab stored, changed or deleted a conversation: show it, unless this tab streams into it
  function onStorage(event) {
    if (event.storageArea !== localStorage) return;
    if (event.key === null) loadConversations();
    else if (event.key.startsWith(STORE.chatPrefix)) {
      const id = event.key.slice(STORE.chatPrefix.length);
      if (state.streaming?.conversation.id === id) return;
      const conversation = event.newValue === null ? null : JSON.parse(event.newValue);
      if (conversation) state.conversations.set(id, conversation);
      else state.conversations.delete(id);
      if (id !== state.currentId) return renderConversationList();
    } else if (event.key === STORE.apiKey) return updateKeyButton();
    else return;
    if (!current()) state.currentId = null;
    renderAll();
  }

  // -- notices and announcements ----------------------------------------------------

  function showNotice(text) {
    if (ui.notice.hidden || ui.noticeText.textContent !== text) ui.noticeText.textContent = text;
    ui.notice.hidden = false;
  }

  // a screen reader hears each finished reply once (the message list itself is not live:
  // rewriting it token by token would be read out over and over)
  function announce(text) {
    ui.announcer.textContent = text.length > 4000 ? `${text.slice(0, 4000)}…` : text;
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
        save(STORE.apiKey, key, "The API key");
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
      if (done) throw new ServerError("The connection closed before the reply ended.");
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

  // public, so it says only whether a key is needed when one is; the rest comes from /v1/models
  async function loadConfig() {
    try {
      const response = await fetch("webui/config.json");
      if (response.ok) state.config = await response.json();
    } catch {
      // the page still works with what /v1/models says
    }
  }

  async function loadModels() {
    try {
      const response = await api("v1/models");
      if (response.ok) state.models = (await response.json()).data;
    } catch {
      // offline for a moment: keep the names from config.json
    }
    const names = state.models.length ? state.models.map((model) => model.id) : state.config.models || [];
    ui.model.replaceChildren(
      ...names.map((name) => {
        const option = document.createElement("option");
        option.value = option.textContent = option.title = name;
        return option;
      })
    );
    if (names.includes(state.settings.model)) ui.model.value = state.settings.model;
    modelChosen();
  }

  // the picker shows the whole name as a tooltip; max tokens is bounded by that model's context
  function modelChosen() {
    ui.model.title = ui.model.value;
    const limit = state.models.find((model) => model.id === ui.model.value)?.max_model_len;
    if (limit) ui.maxTokens.max = String(limit);
    else ui.maxTokens.removeAttribute("max");
  }

  // -- conversations --------------------------------------------------------------------

  function current() {
    return state.conversations.get(state.currentId) || null;
  }

  function sortedConversations() {
    return [...state.conversations.values()].sort((a, b) => (b.updated || 0) - (a.updated || 0));
  }

  // a conversation starts with its first message, keeping the system prompt of that moment
  function newConversation(text) {
    const now = Date.now();
    const conversation = {
      id: `${now.toString(36)}${Math.random().toString(36).slice(2, 8)}`,
      title: text.trim().split("\n")[0].slice(0, 60) || NEW_TITLE,
      system: state.settings.system,
      created: now,
      updated: now,
      messages: [],
    };
    state.conversations.set(conversation.id, conversation);
    state.currentId = conversation.id;
    rememberCurrent();
    return conversation;
  }

  function selectConversation(id) {
    if (state.streaming) stop();
    state.currentId = id;
    rememberCurrent();
    renderAll();
    closeSidebar(false);
    ui.prompt.focus();
  }

  function confirmDelete(conversation) {
    ui.deleteText.textContent = `Delete the chat “${conversation.title}”? This cannot be undone.`;
    ui.deleteDialog.returnValue = "";
    ui.deleteDialog.onclose = () => {
      if (ui.deleteDialog.returnValue === "delete") deleteConversation(conversation.id);
      else ui.conversations.querySelector(`[data-id="${CSS.escape(conversation.id)}"] .conversation-delete`)?.focus();
    };
    ui.deleteDialog.showModal();
    ui.deleteCancel.focus();
  }

  function deleteConversation(id) {
    if (state.streaming?.conversation.id === id) stop();
    state.conversations.delete(id);
    localStorage.removeItem(STORE.chatPrefix + id);
    if (state.currentId === id) {
      state.currentId = null;
      rememberCurrent();
    }
    renderAll();
    ui.prompt.focus();
  }

  // a reply's reasoning and answer: the server's reasoning field, else (no reasoning parser on
  // the server) a <think>...</think> block the model wrote at the start of its content
  function replyParts(message) {
    const content = message.content || "";
    if (message.reasoning || state.config.reasoning) return { reasoning: message.reasoning || "", answer: content };
    const open = /^\s*<think>/.exec(content);
    const close = content.indexOf("</think>");
    if (!open && (close < 0 || content.slice(0, close).includes("<think>"))) return { reasoning: "", answer: content };
    const start = open ? open[0].length : 0;
    if (close < 0) return { reasoning: content.slice(start), answer: "" };
    return { reasoning: content.slice(start, close), answer: content.slice(close + "</think>".length).trimStart() };
  }

  // what the model is sent: the conversation's system prompt, then each answered turn and the
  // question being asked; a turn that failed or was stopped before any answer is left out, so
  // the roles alternate and a failed message is never sent twice
  function requestMessages(conversation) {
    const messages = [];
    if (conversation.system?.trim()) messages.push({ role: "system", content: conversation.system });
    const turns = conversation.messages;
    turns.forEach((turn, k) => {
      if (turn.role !== "user") return;
      const reply = turns[k + 1];
      if (!reply) messages.push({ role: "user", content: turn.content });
      else if (reply.role === "assistant" && replyParts(reply).answer.trim()) {
        messages.push({ role: "user", content: turn.content }, { role: "assistant", content: replyParts(reply).answer });
      }
    });
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

  function send(text) {
    if (state.streaming || !text.trim()) return;
    const conversation = current() || newConversation(text);
    conversation.messages.push({ role: "user", content: text });
    ask(conversation);
  }

  // stream a reply to the conversation's last user message
  async function ask(conversation) {
    const question = conversation.messages[conversation.messages.length - 1];
    delete question.failed;
    const body = requestBody(conversation);
    // marked stopped until it ends: a reply cut by a reload or a closed tab is kept, marked
    const reply = { role: "assistant", content: "", reasoning: "", model: body.model || "", stopped: true };
    conversation.messages.push(reply);
    conversation.updated = Date.now();
    saveConversation(conversation);
    renderAll();
    const view = ui.messages.lastElementChild.view;
    const controller = new AbortController();
    state.streaming = { controller, conversation, reply, view, savedAt: performance.now() };
    setStreaming(true);
    const started = performance.now();
    let firstToken = 0;
    let finished = false;
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
      finished = true;
    } catch (error) {
      if (error.name !== "AbortError" && !state.leaving) {
        reply.error =
          error instanceof ServerError ? error.message : `Could not reach the server: ${error.message}`;
      }
    } finally {
      if (finished || reply.error) delete reply.stopped;
      if (reply.error && !replyParts(reply).answer.trim()) question.failed = true;
      state.streaming = null;
      saveConversation(conversation);
      if (current() === conversation) {
        updateReply(view, reply, false);
        const asked = [...ui.messages.children].find((article) => article.message === question);
        asked?.replaceWith(messageView(question)); // marked failed, or no longer
        refreshActions();
      }
      setStreaming(false);
      announce(finishedText(view, reply));
    }
  }

  function finishedText(view, reply) {
    if (reply.error) return `The reply failed: ${reply.error}`;
    const copy = view.content.cloneNode(true); // its text, without the code blocks' Copy buttons
    copy.querySelectorAll(".code-head").forEach((head) => head.remove());
    copy.querySelectorAll("p, li, pre, tr, blockquote, h1, h2, h3, h4, h5, h6").forEach((block) => block.append("\n"));
    return `${reply.stopped ? "Reply stopped. " : ""}${copy.textContent.trim()}`;
  }

  function stop() {
    if (state.streaming) state.streaming.controller.abort();
  }

  // drop the last reply and ask again (Retry after a failure, Regenerate otherwise)
  function regenerate() {
    const conversation = current();
    if (state.streaming || !conversation) return;
    if (conversation.messages[conversation.messages.length - 1]?.role === "assistant") conversation.messages.pop();
    if (conversation.messages.length) ask(conversation);
  }

  // take the last user message (and its reply) back into the message box, to change and resend
  function editLast() {
    const conversation = current();
    if (state.streaming || !conversation) return;
    const k = conversation.messages.findLastIndex((message) => message.role === "user");
    if (k < 0) return;
    const [question] = conversation.messages.splice(k);
    saveConversation(conversation);
    renderAll();
    ui.prompt.value = question.content;
    growPrompt();
    ui.prompt.focus();
  }

  // -- rendering ---------------------------------------------------------------------------

  let updatePending = false;

  function scheduleUpdate() {
    if (updatePending) return;
    updatePending = true;
    const run = () => {
      updatePending = false;
      const streaming = state.streaming;
      if (!streaming) return;
      if (current() === streaming.conversation) updateReply(streaming.view, streaming.reply, true);
      if (performance.now() - streaming.savedAt > SAVE_EVERY_MS) {
        streaming.savedAt = performance.now();
        saveConversation(streaming.conversation);
      }
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

  function button(className, text, onClick) {
    const node = element("button", className, text);
    node.type = "button";
    node.addEventListener("click", onClick);
    return node;
  }

  function messageView(message) {
    const article = element("article", `message ${message.role}`);
    article.setAttribute("aria-label", message.role === "user" ? "You" : "Assistant");
    article.message = message;
    const actions = element("div", "actions");
    if (message.role === "user") {
      article.classList.toggle("failed", Boolean(message.failed));
      const body = element("div", "bubble");
      body.append(element("div", "content plain", message.content));
      if (message.failed) body.append(element("p", "turn-note", "Failed: not sent again unless you Retry or Edit it"));
      article.append(body, actions);
      return article;
    }
    const view = {
      article,
      actions,
      reasoning: null,
      reasoningBody: null,
      content: element("div", "content markdown"),
      error: element("p", "error"),
      meta: element("p", "meta"),
      answering: false,
    };
    article.append(view.content, view.error, view.meta, actions);
    article.view = view;
    updateReply(view, message, false);
    return article;
  }

  function updateReply(view, message, streaming) {
    const follow = nearBottom();
    const { reasoning, answer } = replyParts(message);
    if (reasoning && !view.reasoning) {
      view.reasoning = element("details", "reasoning");
      view.reasoning.append(element("summary", "", "Reasoning"));
      view.reasoningBody = element("div", "markdown");
      view.reasoning.append(view.reasoningBody);
      view.reasoning.open = streaming && !answer; // seen growing while the model thinks
      view.article.prepend(view.reasoning);
    }
    if (view.reasoning) {
      const thinking = streaming && !answer;
      if (!thinking && !view.answering) view.reasoning.open = false; // folded once the answer starts
      view.answering = !thinking;
      view.reasoning.querySelector("summary").textContent = thinking ? "Reasoning…" : "Reasoning";
      view.reasoningBody.innerHTML = markdown.render(reasoning);
    }
    view.content.innerHTML = markdown.render(answer);
    view.article.setAttribute("aria-busy", streaming ? "true" : "false");
    view.article.classList.toggle("streaming", streaming);
    view.error.textContent = message.error || "";
    view.error.hidden = !message.error;
    const facts = [];
    if (message.model) facts.push(message.model);
    if (message.tokens) facts.push(`${message.tokens} tokens`);
    if (message.speed) facts.push(`${message.speed.toFixed(1)} tokens/s`);
    if (message.finish === "length") facts.push("cut at the token limit");
    view.meta.replaceChildren();
    if (!streaming && message.stopped) view.meta.append(element("span", "stopped-mark", "stopped"));
    if (!streaming && facts.length) view.meta.append(`${message.stopped ? " · " : ""}${facts.join(" · ")}`);
    if (follow) ui.messages.scrollTop = ui.messages.scrollHeight;
  }

  // Copy on every message; Edit on the last question, Retry / Regenerate on the last reply
  function refreshActions() {
    const articles = [...ui.messages.querySelectorAll("article.message")];
    const lastUser = articles.findLast((article) => article.message.role === "user");
    const last = articles[articles.length - 1];
    for (const article of articles) {
      const { message } = article;
      const actions = article.querySelector(":scope > .actions");
      const buttons = [];
      if (message.content) buttons.push(button("copy-message", "Copy", (event) => copyText(message.content, event.currentTarget)));
      if (!state.streaming && article === lastUser) buttons.push(button("edit-message", "Edit", editLast));
      if (!state.streaming && article === last && message.role === "assistant") {
        const failed = lastUser?.message.failed;
        buttons.push(button("regenerate", failed ? "Retry" : "Regenerate", regenerate));
      }
      actions.replaceChildren(...buttons);
    }
  }

  function renderConversationList() {
    ui.conversations.replaceChildren(
      ...sortedConversations().map((conversation) => {
        const item = element("li", "conversation");
        item.dataset.id = conversation.id;
        const open = button("conversation-open", conversation.title, () => selectConversation(conversation.id));
        if (conversation.id === state.currentId) open.setAttribute("aria-current", "true");
        const remove = button("conversation-delete icon-button", "×", () => confirmDelete(conversation));
        remove.setAttribute("aria-label", `Delete the chat “${conversation.title}”`);
        remove.title = "Delete";
        item.append(open, remove);
        return item;
      })
    );
  }

  function systemNote(conversation) {
    const note = element("details", "system-note");
    note.append(element("summary", "", "System prompt"), element("div", "plain", conversation.system));
    return note;
  }

  function renderAll() {
    renderConversationList();
    const conversation = current();
    const views = conversation ? conversation.messages.map(messageView) : [];
    if (views.length && conversation.system?.trim()) views.unshift(systemNote(conversation));
    ui.messages.replaceChildren(...(views.length ? views : [ui.emptyHint]));
    refreshActions();
    ui.messages.scrollTop = ui.messages.scrollHeight;
  }

  // the focus never falls to the page: pressing Send (or Regenerate, which the re-render removes)
  // puts it on Stop, in Send's place; once the reply ends, Stop's goes to the message box
  function setStreaming(on) {
    const focus = document.activeElement;
    const lost = focus === document.body || focus === null || focus === (on ? ui.send : ui.stop);
    ui.send.hidden = on;
    ui.stop.hidden = !on;
    ui.composer.classList.toggle("busy", on);
    if (lost) (on ? ui.stop : ui.prompt).focus();
  }

  function updateKeyButton() {
    ui.forgetKey.hidden = !load(STORE.apiKey, "");
  }

  // on a phone the list slides over the chat: a backdrop closes it, the chat behind is inert
  function openSidebar() {
    ui.sidebar.classList.add("open");
    ui.backdrop.hidden = false;
    ui.main.inert = true;
    ui.openSidebar.setAttribute("aria-expanded", "true");
    ui.newChat.focus();
  }

  function closeSidebar(refocus = true) {
    if (!ui.sidebar.classList.contains("open")) return;
    ui.sidebar.classList.remove("open");
    ui.backdrop.hidden = true;
    ui.main.inert = false;
    ui.openSidebar.setAttribute("aria-expanded", "false");
    if (refocus) ui.openSidebar.focus();
  }

  function growPrompt() {
    ui.prompt.style.height = "auto";
    ui.prompt.style.height = `${Math.min(ui.prompt.scrollHeight, 200)}px`;
  }

  async function copyText(text, target) {
    try {
      await navigator.clipboard.writeText(text);
    } catch {
      // no clipboard API (a plain-http page): copy through a selection
      const area = element("textarea");
      area.value = text;
      document.body.append(area);
      area.select();
      document.execCommand("copy");
      area.remove();
    }
    const label = target.textContent;
    target.textContent = "Copied";
    setTimeout(() => (target.textContent = label), 1500);
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
      if (event.key !== "Escape" || ui.keyDialog.open || ui.deleteDialog.open) return;
      if (ui.sidebar.classList.contains("open")) closeSidebar();
      else if (state.streaming) {
        event.preventDefault();
        stop();
      }
    });
    ui.stop.addEventListener("click", () => {
      stop();
      ui.prompt.focus();
    });
    ui.newChat.addEventListener("click", () => {
      if (state.streaming) stop();
      state.currentId = null; // the chat is made by its first message
      rememberCurrent();
      renderAll();
      closeSidebar(false);
      ui.prompt.focus();
    });
    ui.openSidebar.addEventListener("click", openSidebar);
    ui.closeSidebar.addEventListener("click", () => closeSidebar());
    ui.backdrop.addEventListener("click", () => closeSidebar());
    ui.toggleSettings.addEventListener("click", () => {
      ui.settings.hidden = !ui.settings.hidden;
      ui.toggleSettings.setAttribute("aria-expanded", String(!ui.settings.hidden));
      if (!ui.settings.hidden) ui.system.focus();
    });
    ui.model.addEventListener("change", () => {
      state.settings.model = ui.model.value;
      saveSettings();
      modelChosen();
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
    ui.deleteForm.addEventListener("submit", (event) => {
      event.preventDefault();
      ui.deleteDialog.close("delete");
    });
    ui.deleteCancel.addEventListener("click", () => ui.deleteDialog.close(""));
    ui.noticeDismiss.addEventListener("click", () => {
      ui.notice.hidden = true;
      ui.prompt.focus();
    });
    ui.messages.addEventListener("click", (event) => {
      const copy = event.target.closest(".copy-code");
      if (copy) copyText(copy.closest(".code").querySelector("code").textContent, copy);
    });
    window.addEventListener("storage", onStorage);
    // a reload or a closed tab while a reply arrives keeps what came so far, marked stopped
    window.addEventListener("pagehide", () => {
      state.leaving = true;
      if (state.streaming) saveConversation(state.streaming.conversation);
    });
    window.addEventListener("pageshow", () => (state.leaving = false)); // back from the back-forward cache
  }

  async function start() {
    loadConversations();
    if (!current()) state.currentId = null;
    wire();
    updateKeyButton();
    renderAll();
    await loadConfig();
    await loadModels();
    renderAll(); // with the config: <think> blocks fold when the server has no reasoning parser
    document.body.dataset.ready = "true"; // for tests and scripts: the model list is in
  }

  start();
})();
