// meshfast dashboard: plain JavaScript, no framework, no network beyond this origin's /admin API.
// Every piece of text goes into the page through textContent (never innerHTML), and the page runs
// under a Content-Security-Policy with no inline script or style.
"use strict";

(() => {
  const main = document.getElementById("main");
  const nav = document.getElementById("nav");
  const sessionBox = document.getElementById("session");
  const toastBox = document.getElementById("toast");
  const SVG = "http://www.w3.org/2000/svg";
  const COLORS = ["#0b57d0", "#b3261e", "#146c2e", "#8a4b00", "#6b3fa0", "#00677f", "#a0306e", "#4a5360"];
  const DAYS = ["Sun", "Mon", "Tue", "Wed", "Thu", "Fri", "Sat"];
  const FAMILIES = ["openai", "openai_responses", "anthropic", "gemini", "ollama", "generic"];
  const KINDS = ["chat", "embedding", "image_generation", "video_generation"];
  // Provider quick-fill (mesh-behaviour §4.7): base_url is the API root; the family adds the paths.
  const PRESETS = {
    openai: { label: "OpenAI", family: "openai", base_url: "https://api.openai.com", local: false },
    openai_responses: { label: "OpenAI (Responses)", family: "openai_responses", base_url: "https://api.openai.com", local: false },
    anthropic: { label: "Anthropic", family: "anthropic", base_url: "https://api.anthropic.com", local: false },
    gemini: { label: "Gemini", family: "gemini", base_url: "https://generativelanguage.googleapis.com", local: false },
    ollama: { label: "Ollama / local", family: "ollama", base_url: "http://127.0.0.1:11434", local: true },
    generic: { label: "Generic (templates)", family: "generic", base_url: "", local: false },
  };
  const browserTz = Intl.DateTimeFormat().resolvedOptions().timeZone || "UTC";

  const state = { me: null, csrf: null, users: [], models: [], providers: [] };

  // --- small DOM helpers -------------------------------------------------------------------

  let uid = 0;
  const nextId = (p) => `${p}-${++uid}`;

  function h(tag, attrs, ...children) {
    const el = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === undefined || v === null || v === false) continue;
      if (k === "on") for (const [ev, fn] of Object.entries(v)) el.addEventListener(ev, fn);
      else if (k === "dataset") Object.assign(el.dataset, v);
      else if (k === "class") el.className = v;
      else if (k === "text") el.textContent = v;
      else if (k === "value") el.value = v;
      else if (k === "checked" || k === "selected" || k === "disabled" || k === "hidden" || k === "required") el[k] = true;
      else el.setAttribute(k, v === true ? "" : String(v));
    }
    append(el, children);
    return el;
  }

  function append(el, children) {
    for (const c of children.flat(Infinity)) {
      if (c === null || c === undefined || c === false) continue;
      el.append(c instanceof Node ? c : document.createTextNode(String(c)));
    }
    return el;
  }

  function s(tag, attrs, ...children) {
    const el = document.createElementNS(SVG, tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === undefined || v === null) continue;
      if (k === "text") el.textContent = v;
      else el.setAttribute(k, String(v));
    }
    for (const c of children.flat(Infinity)) if (c) el.append(c);
    return el;
  }

  // A labelled form control. kind: input type, "select" (options: [[value, label]]), "textarea".
  function field(label, name, opts = {}) {
    const id = opts.id || nextId(name);
    let control;
    if (opts.kind === "select") {
      control = h("select", { id, name, required: opts.required, "aria-describedby": opts.hint ? `${id}-hint` : null },
        (opts.options || []).map(([v, l]) => h("option", { value: v, selected: String(v) === String(opts.value ?? "") }, l)));
    } else if (opts.kind === "textarea") {
      control = h("textarea", { id, name, rows: opts.rows || 3, required: opts.required, "aria-describedby": opts.hint ? `${id}-hint` : null }, opts.value ?? "");
    } else if (opts.kind === "checkbox") {
      control = h("input", { id, name, type: "checkbox", checked: !!opts.value });
      return h("div", { class: "check" }, control, h("label", { for: id }, label));
    } else {
      control = h("input", {
        id, name, type: opts.kind || "text", value: opts.value ?? "", required: opts.required,
        autocomplete: opts.autocomplete || "off", placeholder: opts.placeholder, step: opts.step, min: opts.min,
        inputmode: opts.inputmode, list: opts.list, "aria-describedby": opts.hint ? `${id}-hint` : null,
      });
    }
    return h("div", { class: "field" }, h("label", { for: id }, label), control,
      opts.hint ? h("span", { id: `${id}-hint`, class: "muted" }, opts.hint) : null);
  }

  function table(caption, columns, rows, opts = {}) {
    // columns: [{key, label, num?, render?(row) -> node|text, sort?}]
    const thead = h("thead", {}, h("tr", {}, columns.map((c) => {
      const sortable = opts.sort && c.sort;
      const active = sortable && opts.sort.key === c.sort;
      const ariaSort = active ? (opts.sort.order === "asc" ? "ascending" : "descending") : null;
      return h("th", { scope: "col", class: c.num ? "num" : null, "aria-sort": ariaSort },
        sortable ? h("button", { type: "button", class: "sort", on: { click: () => opts.onSort(c.sort) } },
          c.label, active ? (opts.sort.order === "asc" ? " ▲" : " ▼") : "") : c.label);
    })));
    const body = h("tbody", {}, rows.length === 0
      ? h("tr", {}, h("td", { colspan: columns.length, class: "muted" }, opts.empty || "Nothing here yet."))
      : rows.map((r) => h("tr", { dataset: opts.rowData ? opts.rowData(r) : {} }, columns.map((c) => {
        const v = c.render ? c.render(r) : r[c.key];
        return h("td", { class: c.num ? "num" : null, dataset: { col: c.key } }, v === null || v === undefined ? "—" : v);
      }))));
    return h("div", { class: "table-wrap" }, h("table", { id: opts.id, dataset: opts.data || {} },
      h("caption", {}, caption), thead, body));
  }

  function button(label, onClick, cls, attrs = {}) {
    return h("button", { type: "button", class: cls, ...attrs, on: { click: onClick } }, label);
  }

  function toast(message, isError = false) {
    toastBox.classList.toggle("error", isError);
    toastBox.textContent = "";
    // A fresh node so screen readers announce a repeat of the same message.
    setTimeout(() => { toastBox.textContent = message; }, 30);
    clearTimeout(toast.timer);
    toast.timer = setTimeout(() => { toastBox.textContent = ""; }, 8000);
  }

  const usd = (n) => (n === null || n === undefined ? "—" : `$${Number(n).toFixed(6)}`);
  const num = (n) => (n === null || n === undefined ? "—" : Number(n).toLocaleString("en-US"));
  const when = (iso) => (iso ? new Date(iso).toLocaleString() : "—");
  const isoFromLocal = (v) => (v ? new Date(v).toISOString() : null);
  function localInput(date) {
    const pad = (n) => String(n).padStart(2, "0");
    return `${date.getFullYear()}-${pad(date.getMonth() + 1)}-${pad(date.getDate())}T${pad(date.getHours())}:${pad(date.getMinutes())}`;
  }

  function formData(form) {
    const out = {};
    for (const el of form.elements) {
      if (!el.name) continue;
      if (el.type === "checkbox") out[el.name] = el.checked;
      else out[el.name] = el.value.trim();
    }
    return out;
  }

  // --- API ---------------------------------------------------------------------------------

  class ApiError extends Error {
    constructor(status, body) {
      const code = (body && (body.error || body.code)) || `http_${status}`;
      const detail = body && (body.detail || body.message);
      super(detail ? `${code}: ${typeof detail === "string" ? detail : JSON.stringify(detail)}` : code);
      this.status = status;
      this.code = code;
      this.body = body;
    }
  }

  function csrfCookie() {
    const m = document.cookie.split(";").map((c) => c.trim()).find((c) => c.startsWith("mesh_csrf="));
    return m ? decodeURIComponent(m.slice("mesh_csrf=".length)) : null;
  }

  async function api(method, path, body, extraHeaders = {}, quiet = false) {
    const headers = { accept: "application/json", ...extraHeaders };
    if (body !== undefined) headers["content-type"] = "application/json";
    if (!["GET", "HEAD"].includes(method)) headers["x-csrf-token"] = csrfCookie() || state.csrf || "";
    const res = await fetch(path, {
      method, headers, credentials: "same-origin", body: body === undefined ? undefined : JSON.stringify(body),
    });
    const text = await res.text();
    let data = null;
    try { data = text ? JSON.parse(text) : null; } catch { data = text; }
    if (res.status === 401 && path !== "/admin/login" && !quiet) {
      // The session ended (expired, logged out elsewhere): back to the login form.
      state.me = null;
      showChrome(false);
      if (location.hash !== "#/login") location.hash = "#/login";
      throw new ApiError(401, data);
    }
    if (!res.ok) throw new ApiError(res.status, data);
    return { data, headers: res.headers, status: res.status };
  }
  const get = async (path) => (await api("GET", path)).data;

  // Run an admin write from a button or form; reports the outcome in the live region.
  async function act(work, success) {
    try {
      const out = await work();
      if (pendingChange(out)) toast(submittedText(out));
      else if (success) toast(typeof success === "function" ? success(out) : success);
      return out;
    } catch (err) {
      toast(`Failed: ${err.message}`, true);
      return undefined;
    }
  }

  function confirmed(message) { return window.confirm(message); }

  // A write a business unit's administrator makes that relaxes a control is not applied: it
  // answers 202 {change_id, status: "pending"} and waits in the approval queue.
  const pendingChange = (out) => (out && out.status === 202 && out.data && out.data.change_id ? out.data.change_id : null);
  const submittedText = (out) => `Submitted for approval (change ${pendingChange(out)}).`;

  // GET that a scoped administrator may be refused (403): an empty answer instead.
  async function getOr(path, fallback) {
    try {
      return await get(path);
    } catch (err) {
      if (err.status === 403 || err.status === 404) return fallback;
      throw err;
    }
  }

  async function loadRegistry() {
    // NOTE: providers are platform-wide: a business unit's administrator is not asked for them (403).
    const [users, models, providers] = await Promise.all([getOr("/admin/users", []), getOr("/admin/models", []),
      isUnitAdmin() ? [] : getOr("/admin/providers", [])]);
    state.users = users || [];
    state.models = models || [];
    state.providers = providers || [];
  }

  const userLabel = (id) => {
    if (!id) return "Unknown";
    const u = state.users.find((x) => x.id === id);
    return u ? u.email : id;
  };

  // --- page frame and routing ----------------------------------------------------------------

  // Who is asking, from /admin/me: a platform administrator, a business unit's administrator
  // (scoped to its units), or an administrator without unit scope.
  const myRole = () => (state.me && state.me.role) || (state.me && state.me.is_super_admin ? "platform" : "admin");
  const isPlatform = () => myRole() === "platform";
  const isUnitAdmin = () => myRole() === "business_unit";
  const myUnits = () => ((state.me && state.me.business_units) || []).map((u) => (typeof u === "string" ? u : u.name || u.id));
  // What a business unit's administrator may open: its people (and their grants and policies),
  // logs, rules, approvals (read-only), audit records and units; the rest answers it 403.
  const UNIT_ROUTES = ["users", "access", "logs", "rules", "approvals", "business-units", "audit"];
  const allowed = (name) => !isUnitAdmin() || UNIT_ROUTES.includes(name);

  function showChrome(on) {
    nav.hidden = !on;
    sessionBox.hidden = !on;
    const role = isUnitAdmin() ? ` (business unit administrator: ${myUnits().join(", ") || "no unit"})`
      : state.me && state.me.is_super_admin ? " (super admin)" : "";
    document.getElementById("who").textContent = on && state.me ? `${state.me.email}${role}` : "";
    for (const a of nav.querySelectorAll("a")) a.parentElement.hidden = !allowed(a.getAttribute("href").slice(2));
  }

  function page(title, ...children) {
    main.textContent = "";
    document.title = `${title} · meshfast`;
    const heading = h("h1", { tabindex: "-1" }, title);
    // A business unit's administrator sees, on every page, whose data it is.
    const scope = isUnitAdmin() ? h("p", { class: "scope-note", id: "scope-note" },
      `Your scope: business unit${myUnits().length === 1 ? "" : "s"} ${myUnits().join(", ") || "(none)"}. `,
      "You see and change only what belongs to them; changes that relax a control wait for a platform administrator's approval.") : null;
    append(main, [heading, scope, ...children]);
    for (const a of nav.querySelectorAll("a")) {
      if (a.getAttribute("href") === `#/${currentRoute()}`) a.setAttribute("aria-current", "page");
      else a.removeAttribute("aria-current");
    }
    return heading;
  }

  const currentRoute = () => (location.hash.startsWith("#/") ? location.hash.slice(2).split("?")[0] : "");

  const ROUTES = {
    overview: renderOverview, logs: renderLogs, users: renderUsers, providers: renderProviders, models: renderModels,
    access: renderAccess, rules: renderRules, notifications: renderNotifications, gateway: renderGateway,
    audit: renderAudit, admins: renderAdmins, identity: renderIdentity, workflows: renderWorkflows,
    applications: renderApplications, dlp: renderDlp, approvals: renderApprovals, pilots: renderPilots,
    "business-units": renderBusinessUnits,
  };

  let routing = 0;
  async function route() {
    const name = currentRoute();
    const ticket = ++routing;
    if (!state.me) {
      try {
        state.me = (await api("GET", "/admin/me", undefined, {}, true)).data;
      } catch {
        state.me = null;
      }
    }
    if (ticket !== routing) return;
    if (!state.me) {
      showChrome(false);
      renderLogin();
      return;
    }
    showChrome(true);
    if (name === "login" || !ROUTES[name] || !allowed(name)) {
      location.replace(isUnitAdmin() ? "#/users" : "#/overview");
      return;
    }
    try {
      await ROUTES[name]();
    } catch (err) {
      if (err.status !== 401) page("Something went wrong", h("p", { class: "error-text", role: "alert" }, err.message));
    }
    const heading = main.querySelector("h1");
    if (heading && ticket === routing) heading.focus();
  }

  async function rerender() {
    const focusedId = document.activeElement && document.activeElement.id;
    await ROUTES[currentRoute()]();
    const again = focusedId && document.getElementById(focusedId);
    if (again) again.focus();
    else { const heading = main.querySelector("h1"); if (heading) heading.focus(); }
  }

  // --- login ---------------------------------------------------------------------------------

  function renderLogin() {
    if (document.getElementById("login-email")) return; // already showing; keep what was typed
    const error = h("p", { class: "error-text", role: "alert", id: "login-error" });
    const form = h("form", { "aria-labelledby": "login-title", novalidate: true },
      field("Email", "email", { kind: "email", required: true, autocomplete: "username", id: "login-email" }),
      field("Password", "password", { kind: "password", required: true, autocomplete: "current-password", id: "login-password" }),
      h("button", { type: "submit", id: "login-submit" }, "Log in"), error);
    form.addEventListener("submit", async (ev) => {
      ev.preventDefault();
      error.textContent = "";
      const { email, password } = formData(form);
      try {
        const out = await api("POST", "/admin/login", { email, password });
        state.csrf = out.data.csrf_token;
        state.me = (await api("GET", "/admin/me")).data;
        // Back to the page that was asked for, else the overview (a unit's administrator: its people).
        if (ROUTES[currentRoute()] && allowed(currentRoute())) route();
        else location.hash = isUnitAdmin() ? "#/users" : "#/overview";
      } catch (err) {
        error.textContent = err.code === "invalid_credentials" ? "Wrong email or password."
          : err.code === "account_locked" ? "This account is locked for 15 minutes after repeated failures."
          : err.status === 429 ? "Too many attempts; wait a moment and try again." : `Login failed: ${err.message}`;
      }
    });
    main.textContent = "";
    document.title = "Log in · meshfast";
    const sso = h("p", { id: "sso", hidden: true }, h("a", { href: "/admin/oidc/login", id: "sso-login" }, "Sign in with SSO"));
    append(main, [h("section", { class: "login panel" }, h("h1", { id: "login-title", tabindex: "-1" }, "Log in to meshfast"), form, sso)]);
    document.getElementById("login-email").focus();
    ssoConfigured().then((on) => { sso.hidden = !on; });
  }

  // Single sign-on is offered when an OIDC issuer is configured: HEAD /admin/oidc/login answers
  // 204 then and 404 when none is, storing nothing (a GET would begin a login). Asked once per
  // page load.
  let ssoProbe = null;
  function ssoConfigured() {
    ssoProbe = ssoProbe || fetch("/admin/oidc/login", { method: "HEAD", credentials: "same-origin" })
      .then((res) => res.status === 204, () => false);
    return ssoProbe;
  }

  document.getElementById("logout").addEventListener("click", async () => {
    await act(() => api("POST", "/admin/logout"));
    state.me = null;
    state.csrf = null;
    showChrome(false);
    location.hash = "#/login";
    route();
  });

  document.getElementById("skip-link").addEventListener("click", (ev) => {
    ev.preventDefault();
    const heading = main.querySelector("h1");
    (heading || main).focus();
  });

  // --- charts --------------------------------------------------------------------------------

  // A line chart of one or more series over shared buckets, with its numbers in a table.
  function lineChart(id, title, buckets, series, fmt = usd) {
    const W = 480, H = 220, L = 64, R = 10, T = 10, B = 34;
    const max = Math.max(0, ...series.flatMap((sr) => sr.values)) || 1;
    const x = (i) => L + (buckets.length <= 1 ? (W - L - R) / 2 : (i * (W - L - R)) / (buckets.length - 1));
    const y = (v) => T + (H - T - B) * (1 - v / max);
    const svg = s("svg", { viewBox: `0 0 ${W} ${H}`, role: "img", "aria-labelledby": `${id}-title`, "data-chart": id });
    svg.append(s("title", { id: `${id}-title`, text: title }));
    for (let k = 0; k <= 4; k++) {
      const v = (max * k) / 4;
      svg.append(s("line", { x1: L, x2: W - R, y1: y(v), y2: y(v), stroke: "#d5dae1" }));
      svg.append(s("text", { x: L - 6, y: y(v) + 4, "text-anchor": "end", "font-size": 11, fill: "#4a5360", text: fmt(v).replace(/0+$/, "").replace(/\.$/, "") }));
    }
    const step = Math.max(1, Math.ceil(buckets.length / 6));
    buckets.forEach((b, i) => {
      if (i % step === 0 || i === buckets.length - 1) {
        const anchor = i === 0 && buckets.length > 1 ? "start" : i === buckets.length - 1 && buckets.length > 1 ? "end" : "middle";
        svg.append(s("text", { x: x(i), y: H - B + 16, "text-anchor": anchor, "font-size": 11, fill: "#4a5360", text: shortBucket(b) }));
      }
    });
    series.forEach((sr, n) => {
      const color = COLORS[n % COLORS.length];
      const g = s("g", { "data-series": sr.name });
      if (sr.values.length > 1) {
        g.append(s("polyline", { fill: "none", stroke: color, "stroke-width": 2, points: sr.values.map((v, i) => `${x(i)},${y(v)}`).join(" ") }));
      }
      sr.values.forEach((v, i) => g.append(s("circle", { cx: x(i), cy: y(v), r: 3, fill: color, "data-bucket": buckets[i], "data-value": v })));
      svg.append(g);
    });
    const legend = h("ul", { class: "legend", "aria-hidden": "true" }, series.map((sr, n) =>
      h("li", {}, h("span", { class: "swatch", dataset: { color: COLORS[n % COLORS.length] } }), sr.name)));
    for (const sw of legend.querySelectorAll(".swatch")) sw.style.background = sw.dataset.color;
    const rows = [];
    buckets.forEach((b, i) => series.forEach((sr) => rows.push({ bucket: b, series: sr.name, value: sr.values[i] })));
    const data = table(`${title}: data`, [
      { key: "bucket", label: "Period", render: (r) => shortBucket(r.bucket, true) },
      { key: "series", label: "Series" },
      { key: "value", label: "Value", num: true, render: (r) => fmt(r.value) },
    ], rows.filter((r) => r.value !== 0), {
      id: `${id}-table`, empty: "No spend in this period.",
      rowData: (r) => ({ bucket: r.bucket, series: r.series, value: String(r.value) }),
    });
    return h("figure", { class: "chart", id, dataset: { chart: id } }, h("figcaption", {}, title),
      series.length === 0 || buckets.length === 0 ? h("p", { class: "muted" }, "No traffic in this period.") : [svg, legend],
      h("details", { open: true }, h("summary", {}, "Numbers"), h("p", { class: "muted" }, "Periods without spend are left out."), data));
  }

  // Every bucket of [from, to) as the server names them: wall-clock time in ``tz``, no offset.
  function rangeBuckets(from, to, bucket, tz) {
    const fmt = new Intl.DateTimeFormat("en-CA", { timeZone: tz, year: "numeric", month: "2-digit", day: "2-digit", hour: "2-digit", hourCycle: "h23" });
    const out = new Set();
    const step = 3600e3;
    for (let t = Math.floor(from.getTime() / step) * step; t < to.getTime(); t += step) {
      const p = Object.fromEntries(fmt.formatToParts(new Date(t)).map((x) => [x.type, x.value]));
      out.add(`${p.year}-${p.month}-${p.day}T${bucket === "hour" ? p.hour : "00"}:00:00`);
    }
    return [...out];
  }

  // A horizontal bar chart of labelled values, with its numbers in a table.
  function barChart(id, title, items, fmt = usd, extra = []) {
    const W = 480, rowH = 26, L = 150, R = 80;
    const H = Math.max(1, items.length) * rowH + 8;
    const max = Math.max(0, ...items.map((i) => i.value)) || 1;
    const svg = s("svg", { viewBox: `0 0 ${W} ${H}`, role: "img", "aria-labelledby": `${id}-title`, "data-chart": id });
    svg.append(s("title", { id: `${id}-title`, text: title }));
    items.forEach((it, n) => {
      const yy = 4 + n * rowH;
      const w = Math.max(1, ((W - L - R) * it.value) / max);
      svg.append(s("text", { x: L - 6, y: yy + 16, "text-anchor": "end", "font-size": 12, fill: "#1b1f24", text: truncate(it.label, 19) }));
      svg.append(s("rect", { x: L, y: yy + 3, width: w, height: rowH - 8, fill: COLORS[n % COLORS.length], "data-label": it.label, "data-value": it.value }));
      svg.append(s("text", { x: L + w + 6, y: yy + 16, "font-size": 12, fill: "#1b1f24", text: fmt(it.value) }));
    });
    const data = table(`${title}: data`, [
      { key: "label", label: "Name" },
      { key: "value", label: "Spend", num: true, render: (r) => fmt(r.value) },
      ...extra,
    ], items, { id: `${id}-table`, empty: "No traffic in this period.", rowData: (r) => ({ label: r.label, value: String(r.value), calls: String(r.calls ?? "") }) });
    return h("figure", { class: "chart", id, dataset: { chart: id } }, h("figcaption", {}, title),
      items.length === 0 ? h("p", { class: "muted" }, "No traffic in this period.") : svg,
      h("details", { open: true }, h("summary", {}, "Numbers"), data));
  }

  function truncate(text, n) { return text.length > n ? `${text.slice(0, n - 1)}…` : text; }
  function shortBucket(b, long = false) {
    const d = new Date(b.length <= 19 ? `${b}Z` : b);
    if (Number.isNaN(d.getTime())) return b;
    // Buckets are wall-clock times in the chosen zone (no offset); show them as such.
    const iso = b.replace("T", " ").slice(0, 16);
    return long ? iso : iso.slice(5);
  }

  // --- overview ------------------------------------------------------------------------------

  const RANGES = [["24h", "Last 24 hours", 1], ["7d", "Last 7 days", 7], ["30d", "Last 30 days", 30]];
  let overviewRange = "24h";

  async function renderOverview() {
    await loadRegistry();
    const days = RANGES.find((r) => r[0] === overviewRange)[2];
    const to = new Date();
    const from = new Date(to.getTime() - days * 86400e3);
    const bucket = days <= 2 ? "hour" : "day";
    const qs = (extra = "") => `/admin/logs/summary?from=${encodeURIComponent(from.toISOString())}&to=${encodeURIComponent(to.toISOString())}&tz=${encodeURIComponent(browserTz)}&bucket=${bucket}${extra}`;
    const summary = await get(qs());
    const t = summary.totals || {};
    const byModel = summary.by_model || [];
    const byUser = summary.by_user || [];
    const modelInfo = (id) => state.models.find((m) => m.id === id);

    // Spend over time per person and per model: one filtered summary each (top 6 by spend).
    const topUsers = byUser.filter((u) => u.user_id).slice(0, 6);
    const topModels = [...byModel].filter((m) => m.model_id).sort((a, b) => b.cost_usd - a.cost_usd).slice(0, 12);
    const [userSeries, modelSeries] = await Promise.all([
      Promise.all(topUsers.map((u) => get(qs(`&user_id=${u.user_id}`)).then((r) => ({ name: userLabel(u.user_id), series: r.series || [] })))),
      Promise.all(topModels.map((m) => get(qs(`&model_id=${m.model_id}`)).then((r) => ({ id: m.model_id, name: m.model_name || m.model_id, series: r.series || [] })))),
    ]);
    const buckets = [...new Set([rangeBuckets(from, to, bucket, browserTz), (summary.series || []).map((p) => p.bucket), userSeries.flatMap((u) => u.series.map((p) => p.bucket)),
      modelSeries.flatMap((m) => m.series.map((p) => p.bucket))].flat())].sort();
    const along = (points) => buckets.map((b) => { const p = points.find((q) => q.bucket === b); return p ? p.cost_usd : 0; });
    const providerSeries = new Map();
    for (const m of modelSeries) {
      const info = modelInfo(m.id);
      const pname = info ? info.provider_name : "Deleted provider";
      const acc = providerSeries.get(pname) || buckets.map(() => 0);
      along(m.series).forEach((v, i) => { acc[i] = Math.round((acc[i] + v) * 1e9) / 1e9; });
      providerSeries.set(pname, acc);
    }
    const byProvider = new Map();
    for (const m of byModel) {
      const info = modelInfo(m.model_id);
      const pname = m.model_id ? (info ? info.provider_name : "Deleted provider") : "No model resolved";
      const acc = byProvider.get(pname) || { label: pname, value: 0, calls: 0 };
      acc.value = Math.round((acc.value + m.cost_usd) * 1e9) / 1e9;
      acc.calls += m.calls;
      byProvider.set(pname, acc);
    }

    const rangeSelect = h("select", { id: "overview-range", name: "range" },
      RANGES.map(([v, l]) => h("option", { value: v, selected: v === overviewRange }, l)));
    const totals = [
      ["calls", "Calls", num(t.calls), t.calls], ["errors", "Upstream errors", num(t.errors), t.errors],
      ["denials", "Denied", num(t.denials), t.denials], ["tokens_in", "Tokens in", num(t.tokens_in), t.tokens_in],
      ["tokens_out", "Tokens out", num(t.tokens_out), t.tokens_out], ["cost_usd", "Spend (USD)", usd(t.cost_usd), t.cost_usd],
      ["avg_latency_ms", "Average latency", t.avg_latency_ms == null ? "—" : `${t.avg_latency_ms} ms`, t.avg_latency_ms],
      ["cache_read_tokens", "Prompt tokens read from cache", num(t.cache_read_tokens || 0), t.cache_read_tokens],
      ["cache_write_tokens", "Prompt tokens written to cache", num(t.cache_write_tokens || 0), t.cache_write_tokens],
      ["cache_hit_rate", "Prompt cache hit rate", t.cache_hit_rate == null ? "—" : `${(t.cache_hit_rate * 100).toFixed(1)} %`, t.cache_hit_rate],
    ];
    const callsCol = [{ key: "calls", label: "Calls", num: true, render: (r) => num(r.calls) }];
    page("Overview",
      h("div", { class: "toolbar" },
        h("div", { class: "field" }, h("label", { for: "overview-range" }, "Period"), rangeSelect),
        button("Refresh", () => rerender(), "secondary", { id: "overview-refresh" }),
        h("p", { class: "muted" }, `Times in ${browserTz}; ${bucket === "hour" ? "hourly" : "daily"} buckets.`)),
      h("h2", {}, "Totals"),
      h("dl", { class: "totals", id: "totals" }, totals.map(([k, label, text, raw]) =>
        h("div", { dataset: { total: k, value: String(raw ?? "") } }, h("dt", {}, label), h("dd", {}, text)))),
      h("h2", {}, "Spend over time"),
      h("div", { class: "charts" },
        lineChart("spend-over-time", "Total spend over time", buckets, [{ name: "All traffic", values: along(summary.series || []) }]),
        lineChart("spend-over-time-person", "Spend over time per person", buckets, userSeries.map((u) => ({ name: u.name, values: along(u.series) }))),
        lineChart("spend-over-time-model", "Spend over time per model", buckets, modelSeries.map((m) => ({ name: m.name, values: along(m.series) }))),
        lineChart("spend-over-time-provider", "Spend over time per provider", buckets, [...providerSeries].map(([name, values]) => ({ name, values })))),
      h("h2", {}, "Spend by person, model and provider"),
      h("div", { class: "charts" },
        barChart("spend-by-person", "Spend by person", byUser.map((u) => ({ label: userLabel(u.user_id), value: u.cost_usd, calls: u.calls })), usd, callsCol),
        barChart("spend-by-model", "Spend by model", byModel.map((m) => ({ label: m.model_name || "No model resolved", value: m.cost_usd, calls: m.calls })), usd, callsCol),
        barChart("spend-by-provider", "Spend by provider", [...byProvider.values()].sort((a, b) => b.value - a.value), usd, callsCol)),
      h("h2", {}, "Outcomes and latency"),
      h("div", { class: "charts" },
        table("Calls by outcome", [{ key: "status", label: "Outcome" }, { key: "calls", label: "Calls", num: true }], summary.by_status || [],
          { id: "by-status", rowData: (r) => ({ label: r.status, value: String(r.calls) }) }),
        table("Denials by reason", [{ key: "deny_reason", label: "Reason" }, { key: "calls", label: "Calls", num: true }], summary.by_deny_reason || [],
          { id: "by-deny-reason", rowData: (r) => ({ label: r.deny_reason, value: String(r.calls) }) }),
        table("Latency", [{ key: "le_ms", label: "Up to", render: (r) => (r.le_ms ? `${r.le_ms} ms` : "slower") }, { key: "calls", label: "Calls", num: true }],
          summary.latency_buckets || [], { id: "latency-buckets", rowData: (r) => ({ label: String(r.le_ms ?? "slower"), value: String(r.calls) }) })),
      h("h2", {}, "Tools declared and called"),
      h("p", { class: "muted" }, "Tools callers declared and how often the model called them; a tool declared and never called costs its definition's tokens on every request."),
      h("div", {},
        table("Tools", [{ key: "tool", label: "Tool" }, { key: "declared_calls", label: "Declared in", num: true },
          { key: "invoked_calls", label: "Called in", num: true },
          { key: "invocation_rate", label: "Called", num: true, render: (r) => (r.invocation_rate === null ? "—" : `${(r.invocation_rate * 100).toFixed(1)} %`) },
          { key: "estimated_tokens_per_declaration", label: "Tokens per declaration", num: true }],
        summary.by_tool || [], { id: "by-tool", empty: "No call declared tools in this range.",
          rowData: (r) => ({ label: r.tool, value: String(r.declared_calls), invoked: String(r.invoked_calls) }) })));
    rangeSelect.addEventListener("change", () => { overviewRange = rangeSelect.value; rerender(); });
  }

  // --- logs explorer -------------------------------------------------------------------------

  const logsQuery = { user_id: "", model_id: "", status: "", from: "", to: "", q: "", sort: "created_at", order: "desc", page: 1, page_size: 25 };

  async function renderLogs() {
    await loadRegistry();
    const params = new URLSearchParams();
    for (const k of ["user_id", "model_id", "status", "q", "sort", "order", "page", "page_size"]) if (logsQuery[k]) params.set(k, logsQuery[k]);
    const from = logsQuery.from ? new Date(logsQuery.from) : new Date(Date.now() - 86400e3);
    const to = logsQuery.to ? new Date(logsQuery.to) : new Date(Date.now() + 60e3);
    params.set("from", from.toISOString());
    params.set("to", to.toISOString());
    const out = await get(`/admin/logs?${params}`);
    const pages = Math.max(1, Math.ceil(out.total / out.page_size));
    const form = h("form", { class: "grid panel", id: "logs-filters", "aria-label": "Log filters" },
      field("User", "user_id", { kind: "select", value: logsQuery.user_id, options: [["", "Anyone"], ...state.users.map((u) => [u.id, u.email])] }),
      field("Model", "model_id", { kind: "select", value: logsQuery.model_id, options: [["", "Any model"], ...state.models.map((m) => [m.id, m.name])] }),
      field("Outcome", "status", { kind: "select", value: logsQuery.status, options: [["", "Any"], ["success", "Success"], ["error", "Upstream error"], ["denied", "Denied"]] }),
      field("From", "from", { kind: "datetime-local", value: logsQuery.from || localInput(from) }),
      field("To", "to", { kind: "datetime-local", value: logsQuery.to, hint: "Empty: now" }),
      field("Search", "q", { kind: "search", value: logsQuery.q, hint: "Request id or model name", id: "logs-search" }),
      field("Sort by", "sort", { kind: "select", value: logsQuery.sort, options: [["created_at", "Time"], ["latency_ms", "Latency"], ["cost", "Cost"], ["tokens", "Tokens"]] }),
      field("Order", "order", { kind: "select", value: logsQuery.order, options: [["desc", "Descending"], ["asc", "Ascending"]] }),
      field("Rows per page", "page_size", { kind: "select", value: logsQuery.page_size, options: [[10, "10"], [25, "25"], [50, "50"], [100, "100"]] }),
      h("div", { class: "actions" }, h("button", { type: "submit", id: "logs-apply" }, "Apply filters"),
        button("Reset", () => { Object.assign(logsQuery, { user_id: "", model_id: "", status: "", from: "", to: "", q: "", sort: "created_at", order: "desc", page: 1 }); rerender(); }, "secondary")));
    form.addEventListener("submit", (ev) => {
      ev.preventDefault();
      const d = formData(form);
      Object.assign(logsQuery, { ...d, page: 1, page_size: Number(d.page_size) || 25 });
      rerender();
    });
    const onSort = (key) => {
      logsQuery.order = logsQuery.sort === key && logsQuery.order === "desc" ? "asc" : "desc";
      logsQuery.sort = key;
      logsQuery.page = 1;
      rerender();
    };
    const outcome = (r) => h("span", { class: `badge ${r.outcome === "success" ? "ok" : r.outcome === "denied" ? "warn" : "bad"}` }, r.outcome);
    page("Logs",
      form,
      h("p", { id: "logs-total", dataset: { total: String(out.total) }, "aria-live": "polite" }, `${num(out.total)} requests match.`),
      table("Requests", [
        { key: "created_at", label: "Time", sort: "created_at", render: (r) => when(r.created_at) },
        { key: "request_id", label: "Request id", render: (r) => h("code", {}, r.request_id) },
        { key: "user_id", label: "User", render: (r) => userLabel(r.user_id) },
        { key: "model_name", label: "Model" },
        { key: "outcome", label: "Outcome", render: outcome },
        { key: "deny_reason", label: "Deny reason" },
        { key: "status_code", label: "Status", num: true },
        { key: "latency_ms", label: "Latency (ms)", num: true, sort: "latency_ms" },
        { key: "tokens", label: "Tokens in / out", num: true, sort: "tokens", render: (r) => `${r.tokens_in} / ${r.tokens_out}` },
        { key: "cost", label: "Cost", num: true, sort: "cost", render: (r) => usd(r.input_cost + r.output_cost) },
        { key: "dlp", label: "Data protection", render: dlpCell },
      ], out.logs, {
        id: "logs-table", empty: "No requests match these filters.", sort: { key: logsQuery.sort, order: logsQuery.order }, onSort,
        rowData: (r) => ({ requestId: r.request_id, cost: String(r.input_cost + r.output_cost), tokensIn: String(r.tokens_in), tokensOut: String(r.tokens_out), outcome: r.outcome,
          dlpAction: r.dlp_action || "" }),
      }),
      h("nav", { class: "pager", "aria-label": "Log pages" },
        button("Previous page", () => { logsQuery.page -= 1; rerender(); }, "secondary", { id: "logs-prev", disabled: out.page <= 1 }),
        h("span", {}, `Page ${out.page} of ${pages}`),
        button("Next page", () => { logsQuery.page += 1; rerender(); }, "secondary", { id: "logs-next", disabled: out.page >= pages })));
  }

  // --- users and keys ------------------------------------------------------------------------

  let pendingSecret = null; // {title, value, note}: shown once, then dropped

  function secretPanel() {
    if (!pendingSecret) return null;
    const { title, value, note } = pendingSecret;
    pendingSecret = null; // shown once: the next render of any page drops it
    const code = h("code", { id: "new-secret", dataset: { secret: value } }, value);
    const status = h("span", { role: "status", id: "copy-status" });
    const panel = h("section", { class: "panel secret", "aria-labelledby": "secret-title", id: "secret-panel" },
      h("h2", { id: "secret-title" }, title),
      h("p", {}, note || "Copy it now: it is shown only once and cannot be retrieved later."),
      code,
      h("div", { class: "actions" },
        button("Copy to clipboard", async () => {
          try {
            await navigator.clipboard.writeText(value);
            status.textContent = "Copied.";
          } catch {
            const range = document.createRange();
            range.selectNodeContents(code);
            const sel = window.getSelection();
            sel.removeAllRanges();
            sel.addRange(range);
            status.textContent = "Selected; press Ctrl+C to copy.";
          }
        }, "", { id: "copy-secret" }),
        button("I have saved it", () => { panel.remove(); main.querySelector("h1").focus(); }, "secondary", { id: "dismiss-secret" }),
        status));
    return panel;
  }

  function showSecret(title, value, note) {
    pendingSecret = { title, value, note };
  }

  let editingUser = null; // {entity, etag}
  let keysUser = null; // {user, keys}: the user whose named keys are shown

  // One principal's keys (a user's or an application's): the primary one and named ones (prefix,
  // models, expiry, status), a form for a named key (name, expiry, model subset), rotation with an
  // overlap, revocation. holder: {label, path, grantee, keys, reload(), close(), closeLabel?}.
  function keysPanel(holder) {
    const { label, path, keys, reload } = holder;
    const modelNames = new Map(state.models.map((m) => [m.id, m.name]));
    const form = h("form", { class: "grid panel", id: "key-create", "aria-labelledby": "key-create-title" },
      h("h3", { id: "key-create-title" }, "Issue a named key"),
      field("Key name", "name", { required: true, id: "key-name", hint: `Up to 64 characters, unique among ${holder.grantee}'s keys.` }),
      field("Key expires at", "expires_at", { kind: "datetime-local", id: "key-expires", hint: "Your local time; empty: never." }),
      h("div", { class: "field" }, h("label", { for: "key-models" }, "Limit to models"),
        h("select", { id: "key-models", name: "models", multiple: true, size: Math.min(6, Math.max(2, state.models.length)),
          "aria-describedby": "key-models-hint" }, state.models.map((m) => h("option", { value: m.id }, m.name))),
        h("span", { id: "key-models-hint", class: "muted" }, `None selected: every model ${holder.grantee} is granted.`)),
      h("div", { class: "actions" }, h("button", { type: "submit", id: "key-create-submit" }, "Issue key"),
        button(holder.closeLabel || "Close keys", holder.close, "secondary")));
    form.addEventListener("submit", async (ev) => {
      ev.preventDefault();
      const d = formData(form);
      const models = [...form.querySelector("#key-models").selectedOptions].map((o) => o.value);
      const body = { name: d.name, expires_at: fromLocalInput(d.expires_at) };
      if (models.length) body.models = models;
      const out = await act(() => api("POST", `${path}/keys`, body), `Key ${d.name} issued.`);
      if (out) { showSecret(`API key ${d.name} for ${label}`, out.data.key); await reload(); document.getElementById("copy-secret").focus(); }
    });
    const keyActions = (k) => (k.status !== "active" ? "Revoked" : h("div", { class: "actions" },
      k.current ? [h("label", { for: `overlap-${k.id}`, class: "sr-only" }, `Overlap in seconds for ${k.name || "primary key"}`),
      h("input", { id: `overlap-${k.id}`, type: "number", min: 0, max: 2592000, value: 0, inputmode: "numeric", class: "narrow",
        title: "Seconds the old key keeps working" }),
      button("Rotate", async () => {
        const overlap = Number(document.getElementById(`overlap-${k.id}`).value || 0);
        const out = await act(() => api("POST", `/admin/keys/${k.id}/rotate`, { overlap_s: overlap }), `Key ${k.key_prefix} rotated.`);
        if (out) { showSecret(`New API key ${k.name || ""} for ${label}`, out.data.key); await reload(); document.getElementById("copy-secret").focus(); }
      }, "secondary", { "aria-label": `Rotate key ${k.name || k.key_prefix}` })] : null,
      button("Revoke", async () => {
        if (!confirmed(`Revoke the key ${k.key_prefix}? It stops working at once.`)) return;
        if (await act(() => api("DELETE", `/admin/keys/${k.id}`), `Key ${k.key_prefix} revoked.`)) await reload();
      }, "danger", { "aria-label": `Revoke key ${k.current ? (k.name || k.key_prefix) : k.key_prefix}` })));
    return [h("h2", { id: "keys-title" }, `Keys of ${label}`), form,
      table(`Keys of ${label}`, [
        { key: "name", label: "Name", render: (k) => k.name || "primary" },
        { key: "key_prefix", label: "Key", render: (k) => h("code", {}, k.key_prefix) },
        { key: "models", label: "Models", render: (k) => (k.models ? k.models.map((m) => modelNames.get(m) || m).join(", ") || "none" : "all granted") },
        { key: "expires_at", label: "Expires", render: (k) => (k.expires_at ? when(k.expires_at) : "never") },
        { key: "status", label: "Status", render: (k) => h("span", { class: `badge ${k.current ? "ok" : "bad"}` }, k.current ? "current" : (k.status === "active" ? "rotated" : k.status)) },
        { key: "created_at", label: "Created", render: (k) => when(k.created_at) },
        { key: "actions", label: "Actions", render: keyActions },
      ], keys, { id: "keys-table", rowData: (k) => ({ name: k.name || "primary", keyId: k.id }) })];
  }

  function userKeysHolder() {
    const { user: u, keys } = keysUser;
    return {
      label: u.email, path: `/admin/users/${u.id}`, grantee: "the user", keys,
      reload: async () => {
        const out = await act(() => api("GET", `/admin/users/${u.id}/keys`));
        if (out) keysUser = { user: u, keys: out.data };
        await rerender();
      },
      close: () => { keysUser = null; rerender(); },
    };
  }

  // An RFC 3339 time as a datetime-local value in the browser's zone, and back (with its offset).
  const toLocalInput = (iso) => {
    if (!iso) return "";
    const d = new Date(iso);
    const pad = (n) => String(n).padStart(2, "0");
    return `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())}T${pad(d.getHours())}:${pad(d.getMinutes())}`;
  };
  const fromLocalInput = (value) => (value ? new Date(value).toISOString() : null);

  // The organisation and expiry of one user: PUT with the ETag it was read with; empty clears.
  function userEditForm() {
    const u = editingUser.entity;
    const managers = [["", "— none —"], ...state.users.filter((x) => x.id !== u.id).map((x) => [x.id, x.email])];
    const form = h("form", { class: "grid panel", id: "user-edit", "aria-labelledby": "user-edit-title" },
      field("Display name", "display_name", { required: true, id: "user-edit-name", value: u.display_name }),
      field("Manager", "manager_id", { kind: "select", id: "user-edit-manager", value: u.manager_id || "", options: managers }),
      field("Business unit", "business_unit", { id: "user-edit-bu", value: u.business_unit }),
      field("Tier", "tier", { id: "user-edit-tier", value: u.tier }),
      field("Expires at", "expires_at", { kind: "datetime-local", id: "user-edit-expires", value: toLocalInput(u.expires_at),
        hint: "Your local time; empty: never. After it the user's keys are refused." }),
      h("div", { class: "actions" },
        h("button", { type: "submit", id: "user-edit-submit" }, "Save user"),
        button("Cancel", () => { editingUser = null; rerender(); }, "secondary")));
    form.addEventListener("submit", async (ev) => {
      ev.preventDefault();
      const d = formData(form);
      const body = { display_name: d.display_name, manager_id: d.manager_id || null, business_unit: d.business_unit || null,
        tier: d.tier || null, expires_at: fromLocalInput(d.expires_at) };
      const out = await act(() => api("PUT", `/admin/users/${u.id}`, body, { "if-match": editingUser.etag }), `${u.email} saved.`);
      if (out) { editingUser = null; rerender(); }
    });
    return form;
  }

  async function renderUsers() {
    await loadRegistry();
    const form = h("form", { class: "grid panel", id: "user-create", "aria-labelledby": "user-create-title" },
      h("h2", { id: "user-create-title", class: "sr-only" }, "Create a user"),
      field("Email", "email", { kind: "email", required: true, id: "user-email" }),
      field("Display name", "display_name", { required: true, id: "user-name" }),
      field("Manager email", "manager_email", { kind: "email" }),
      field("Business unit", "business_unit"),
      field("Tier", "tier"),
      h("div", { class: "actions" }, h("button", { type: "submit", id: "user-create-submit" }, "Create user and key")));
    form.addEventListener("submit", async (ev) => {
      ev.preventDefault();
      const d = formData(form);
      const body = { email: d.email, display_name: d.display_name };
      for (const k of ["manager_email", "business_unit", "tier"]) if (d[k]) body[k] = d[k];
      const out = await act(() => api("POST", "/admin/users", body), `User ${d.email} created.`);
      if (out) {
        showSecret(`API key for ${out.data.email}`, out.data.key);
        await renderUsers();
        document.getElementById("copy-secret").focus();
      }
    });
    const userActions = (u) => h("div", { class: "actions" },
      button("Edit", async () => {
        const out = await act(() => api("GET", `/admin/users/${u.id}`));
        if (!out) return;
        editingUser = { entity: out.data, etag: out.headers.get("etag") };
        await rerender();
        document.getElementById("user-edit-name").focus();
      }, "secondary", { "aria-label": `Edit ${u.email}` }),
      button("Keys", async () => {
        const out = await act(() => api("GET", `/admin/users/${u.id}/keys`));
        if (!out) return;
        keysUser = { user: u, keys: out.data };
        await rerender();
        document.getElementById("key-name").focus();
      }, "secondary", { "aria-label": `Keys of ${u.email}` }),
      button("Rotate key", async () => {
        if (!confirmed(`Rotate the key of ${u.email}? The current key stops working at once.`)) return;
        const out = await act(() => api("POST", `/admin/users/${u.id}/rotate-key`), `Key of ${u.email} rotated.`);
        if (out) { keysUser = null; showSecret(`New API key for ${u.email}`, out.data.key); await renderUsers(); document.getElementById("copy-secret").focus(); }
      }, "secondary", { "aria-label": `Rotate key of ${u.email}` }),
      button("Revoke", async () => {
        if (!confirmed(`Revoke ${u.email}? Their key stops working at once.`)) return;
        if (await act(() => api("POST", `/admin/users/${u.id}/revoke`), `${u.email} revoked.`)) { keysUser = null; rerender(); }
      }, "danger", { "aria-label": `Revoke ${u.email}`, disabled: u.status !== "active" }),
      button("Delete", async () => {
        if (!confirmed(`Delete ${u.email} and their keys?`)) return;
        if (await act(() => api("DELETE", `/admin/users/${u.id}`), `${u.email} deleted.`)) { keysUser = null; rerender(); }
      }, "danger", { "aria-label": `Delete ${u.email}` }));
    page("Users & keys",
      secretPanel(),
      editingUser ? [h("h2", { id: "user-edit-title" }, `Edit ${editingUser.entity.email}`), userEditForm()] : null,
      keysUser ? keysPanel(userKeysHolder()) : null,
      h("h2", {}, "Create a user"),
      form,
      h("h2", {}, "Users"),
      table("Users and their keys", [
        { key: "email", label: "Email" },
        { key: "display_name", label: "Name" },
        { key: "status", label: "Status", render: (u) => h("span", { class: `badge ${u.status === "active" ? "ok" : "bad"}` }, u.status) },
        { key: "key_prefix", label: "Key", render: (u) => (u.key_prefix ? h("code", {}, u.key_prefix) : "—") },
        { key: "key_status", label: "Key status" },
        { key: "manager_email", label: "Manager", render: (u) => u.manager_email || "—" },
        { key: "business_unit", label: "Business unit" },
        { key: "tier", label: "Tier" },
        { key: "expires_at", label: "Expires", render: (u) => (u.expires_at ? when(u.expires_at) : "never") },
        { key: "created_at", label: "Created", render: (u) => when(u.created_at) },
        { key: "actions", label: "Actions", render: userActions },
      ], state.users, { id: "users-table", rowData: (u) => ({ userId: u.id, email: u.email }) }));
  }

  // --- providers -------------------------------------------------------------------------------

  let editingProvider = null; // {entity, etag}

  function providerForm() {
    const p = editingProvider ? editingProvider.entity : null;
    const preset = h("select", { id: "provider-preset", name: "preset", "aria-describedby": "provider-preset-hint" },
      h("option", { value: "" }, "Choose a preset…"), Object.entries(PRESETS).map(([k, v]) => h("option", { value: k }, v.label)));
    const form = h("form", { class: "grid panel", id: "provider-form", "aria-labelledby": "provider-form-title" },
      h("div", { class: "field" }, h("label", { for: "provider-preset" }, "Preset"), preset,
        h("span", { id: "provider-preset-hint", class: "muted" }, "Fills family, base URL and the local flag")),
      field("Name", "name", { required: true, id: "provider-name", value: p && p.name }),
      field("Family", "family", { kind: "select", id: "provider-family", value: p ? p.family : "openai", options: FAMILIES.map((f) => [f, f]) }),
      field("Base URL", "base_url", { kind: "url", required: true, id: "provider-base-url", value: p && p.base_url, hint: "The API root; the family adds its paths" }),
      field("API key", "api_key", { kind: "password", id: "provider-api-key", required: !p, hint: p ? "Leave empty to keep the current key" : null }),
      field("Max outbound requests/s", "max_outbound_rps", { kind: "number", min: 1, value: p && p.max_outbound_rps }),
      field("Max concurrent upstream calls", "max_concurrent_upstream", { kind: "number", min: 1, value: p && p.max_concurrent_upstream }),
      field("Max calls per hour", "max_calls_per_hour", { kind: "number", min: 1, value: p && p.max_calls_per_hour }),
      field("Max retries", "max_retries", { kind: "number", min: 0, value: p ? p.max_retries : 2 }),
      field("Retry backoff (ms)", "retry_backoff_ms", { kind: "number", min: 0, value: p ? p.retry_backoff_ms : 200 }),
      field("Local (allow loopback and private addresses)", "local", { kind: "checkbox", id: "provider-local", value: p && p.local }),
      field("Retries enabled", "retry_enabled", { kind: "checkbox", value: p ? p.retry_enabled : true }),
      field("Log requests", "log_requests", { kind: "checkbox", value: p ? p.log_requests : true }),
      field("Supports web search", "supports_web_search", { kind: "checkbox", value: p && p.supports_web_search }),
      p ? null : field("Verify with a live call per model", "verify", { kind: "checkbox", id: "provider-verify", value: true }),
      h("div", { class: "actions" },
        h("button", { type: "submit", id: "provider-submit" }, p ? "Save provider" : "Create provider"),
        p ? button("Cancel", () => { editingProvider = null; rerender(); }, "secondary") : null));
    preset.addEventListener("change", () => {
      const v = PRESETS[preset.value];
      if (!v) return;
      form.elements.family.value = v.family;
      form.elements.base_url.value = v.base_url;
      form.elements.local.checked = v.local;
      if (!form.elements.name.value) form.elements.name.value = preset.value;
    });
    form.addEventListener("submit", async (ev) => {
      ev.preventDefault();
      const d = formData(form);
      const body = { name: d.name, family: d.family, base_url: d.base_url, local: d.local, retry_enabled: d.retry_enabled,
        log_requests: d.log_requests, supports_web_search: d.supports_web_search };
      if (d.api_key) body.api_key = d.api_key;
      for (const k of ["max_outbound_rps", "max_concurrent_upstream", "max_calls_per_hour", "max_retries", "retry_backoff_ms"]) {
        if (d[k] !== "") body[k] = Number(d[k]);
      }
      if (!p) {
        body.verify = d.verify;
        const out = await act(() => api("POST", "/admin/providers", body), `Provider ${d.name} created.`);
        if (out) rerender();
      } else {
        const out = await act(() => api("PUT", `/admin/providers/${p.id}`, body, { "if-match": editingProvider.etag }), `Provider ${d.name} saved.`);
        if (out) { editingProvider = null; rerender(); }
      }
    });
    return form;
  }

  async function renderProviders() {
    await loadRegistry();
    const rowActions = (p) => h("div", { class: "actions" },
      button("Edit", async () => {
        const out = await act(() => api("GET", `/admin/providers/${p.id}`));
        if (!out) return;
        editingProvider = { entity: out.data, etag: out.headers.get("etag") };
        await rerender();
        document.getElementById("provider-name").focus();
      }, "secondary", { "aria-label": `Edit provider ${p.name}` }),
      button("Delete", async () => {
        if (!confirmed(`Delete provider ${p.name}, its models, grants and policies?`)) return;
        if (await act(() => api("DELETE", `/admin/providers/${p.id}`), `Provider ${p.name} deleted.`)) rerender();
      }, "danger", { "aria-label": `Delete provider ${p.name}` }));
    page("Providers",
      h("h2", {}, editingProvider ? `Edit provider ${editingProvider.entity.name}` : "Add a provider"),
      providerForm(),
      h("h2", {}, "Providers"),
      table("Providers", [
        { key: "name", label: "Name" }, { key: "family", label: "Family" },
        { key: "base_url", label: "Base URL", render: (p) => h("code", {}, p.base_url) },
        { key: "local", label: "Local", render: (p) => (p.local ? "yes" : "no") },
        { key: "max_calls_per_hour", label: "Calls/hour", num: true },
        { key: "models", label: "Models", num: true, render: (p) => String(state.models.filter((m) => m.provider_id === p.id).length) },
        { key: "actions", label: "Actions", render: rowActions },
      ], state.providers, { id: "providers-table", rowData: (p) => ({ providerId: p.id, name: p.name }) }));
  }

  // --- models ----------------------------------------------------------------------------------

  let editingModel = null;
  // Onboarding: staged (served to no one), limited (to its roster only, on limited terms), then
  // graduated to active; blocked and retired take it out of service.
  const MODEL_STATUSES = ["staged", "limited", "active", "blocked", "retired"];
  const SERVICE_STATUSES = ["active", "blocked", "retired"];
  const statusClass = (status) => (status === "active" ? "ok" : status === "staged" || status === "limited" ? "warn" : "bad");
  let editingOnboarding = null; // {entity, etag}
  let modelProblems = null; // {title, problems}: the last refusal on the models page (a delete's 409)

  // Block, retire or reactivate a model: its status alone, against the ETag just read.
  async function setModelStatus(m, status) {
    const verb = { active: "Reactivate", blocked: "Block", retired: "Retire" }[status];
    if (status !== "active" && !confirmed(`${verb} model ${m.name}? Callers get the unknown-model answer at once.`)) return;
    const out = await act(async () => {
      const current = await api("GET", `/admin/models/${m.id}`);
      return api("PUT", `/admin/models/${m.id}`, { status }, { "if-match": current.headers.get("etag") });
    }, `Model ${m.name} is ${status}.`);
    if (out) rerender();
  }
  const CAPS = [["supports_image_in", "Image input"], ["supports_document_in", "Document input"], ["supports_audio_in", "Audio input"],
    ["supports_video_in", "Video input"], ["supports_web_search", "Web search"]];
  const PRICES = [["input_price_per_1k_tokens", "Input price per 1k tokens (USD)", true], ["output_price_per_1k_tokens", "Output price per 1k tokens (USD)", true],
    ["cache_read_price_per_1k_tokens", "Cache read per 1k (USD)"], ["cache_write_price_per_1k_tokens", "Cache write per 1k (USD)"],
    ["cache_write_1h_price_per_1k_tokens", "Cache write 1 h per 1k (USD)"], ["price_per_second", "Price per generated second (USD)"]];

  function modelForm() {
    const m = editingModel ? editingModel.entity : null;
    const form = h("form", { class: "grid panel", id: "model-form", "aria-labelledby": "model-form-title" },
      field("Provider", "provider_id", { kind: "select", id: "model-provider", required: true, value: m && m.provider_id, options: state.providers.map((p) => [p.id, p.name]) }),
      field("Name", "name", { required: true, id: "model-name", value: m && m.name, hint: "What callers ask for" }),
      field("Resolved model", "resolved_model", { required: true, id: "model-resolved", value: m && m.resolved_model, hint: "The id sent upstream" }),
      field("Kind", "kind", { kind: "select", id: "model-kind", value: m ? m.kind : "chat", options: KINDS.map((k) => [k, k]) }),
      PRICES.map(([k, label, req]) => field(label, k, { inputmode: "decimal", required: !!req, id: `model-${k}`, value: m ? (m[k] ?? "") : (req ? "" : "") })),
      field("Default max output tokens", "max_output_tokens", { kind: "number", min: 1, value: m ? m.max_output_tokens : 4096 }),
      field("Aliases", "aliases", { value: m ? (m.aliases || []).join(", ") : "", hint: "Comma separated" }),
      field("Tags", "tags", { value: m ? (m.tags || []).join(", ") : "", hint: "Comma separated" }),
      field("Output media type", "output_media_type", { value: m && m.output_media_type, hint: "Generation models, e.g. image/png" }),
      field("Status", "status", { kind: "select", id: "model-status", value: m ? m.status : "active", options: MODEL_STATUSES.map((x) => [x, x]),
        hint: "Staged: served to no one; limited: only to its roster (set under Onboarding); blocked and retired answer callers as unknown ones" }),
      h("fieldset", {}, h("legend", {}, "Capabilities"), CAPS.map(([k, label]) => field(label, k, { kind: "checkbox", id: `model-${k}`, value: m && m[k] }))),
      h("fieldset", {}, h("legend", {}, "Prompt cache"),
        field("Shape prompts for the provider's cache", "cache_shaping", { kind: "checkbox", id: "model-cache_shaping", value: m ? m.cache_shaping !== false : true }),
        field("Breakpoint TTL (Anthropic)", "cache_ttl", { kind: "select", id: "model-cache_ttl", value: m ? (m.cache_ttl || "5m") : "5m", options: [["5m", "5 minutes"], ["1h", "1 hour"]] })),
      m ? null : field("Verify with a live call", "verify", { kind: "checkbox", id: "model-verify", value: true }),
      h("div", { class: "actions" }, h("button", { type: "submit", id: "model-submit" }, m ? "Save model" : "Create model"),
        m ? button("Cancel", () => { editingModel = null; rerender(); }, "secondary") : null));
    form.addEventListener("submit", async (ev) => {
      ev.preventDefault();
      const d = formData(form);
      const body = { provider_id: d.provider_id, name: d.name, resolved_model: d.resolved_model, kind: d.kind,
        max_output_tokens: Number(d.max_output_tokens) || 4096,
        aliases: d.aliases ? d.aliases.split(",").map((x) => x.trim()).filter(Boolean) : [],
        tags: d.tags ? d.tags.split(",").map((x) => x.trim()).filter(Boolean) : [] };
      for (const [k] of PRICES) if (d[k] !== "") body[k] = d[k];
      for (const [k] of CAPS) body[k] = d[k];
      body.cache_shaping = d.cache_shaping;
      body.cache_ttl = d.cache_ttl || "5m";
      if (d.output_media_type) body.output_media_type = d.output_media_type;
      if (d.status && (m || d.status !== "active")) body.status = d.status;
      if (!m) {
        body.verify = d.verify;
        if (await act(() => api("POST", "/admin/models", body), `Model ${d.name} created.`)) rerender();
      } else if (await act(() => api("PUT", `/admin/models/${m.id}`, body, { "if-match": editingModel.etag }), `Model ${d.name} saved.`)) {
        editingModel = null;
        rerender();
      }
    });
    return form;
  }

  function deploymentForm() {
    const form = h("form", { class: "grid panel", id: "deployment-form", "aria-labelledby": "deployment-title" },
      field("Model", "model_id", { kind: "select", required: true, options: state.models.map((m) => [m.id, m.name]) }),
      field("Provider", "provider_id", { kind: "select", required: true, options: state.providers.map((p) => [p.id, p.name]) }),
      field("Resolved model", "resolved_model", { required: true }),
      field("Region", "region"),
      field("Priority", "priority", { kind: "number", value: 100, hint: "Lower is tried first" }),
      h("div", { class: "actions" }, h("button", { type: "submit" }, "Add deployment")));
    form.addEventListener("submit", async (ev) => {
      ev.preventDefault();
      const d = formData(form);
      const body = { provider_id: d.provider_id, resolved_model: d.resolved_model, priority: Number(d.priority) || 100 };
      if (d.region) body.region = d.region;
      if (await act(() => api("POST", `/admin/models/${d.model_id}/deployments`, body), "Deployment added.")) rerender();
    });
    return form;
  }

  async function renderModels() {
    await loadRegistry();
    const caps = (m) => CAPS.filter(([k]) => m[k]).map(([, l]) => l).join(", ") || "—";
    const deployments = (m) => (m.deployments && m.deployments.length
      ? h("ul", {}, m.deployments.map((d) => h("li", {}, `${d.provider_name || d.provider_id}/${d.resolved_model} (priority ${d.priority}${d.region ? `, ${d.region}` : ""}) `,
        button("Remove", async () => {
          if (await act(() => api("DELETE", `/admin/models/${m.id}/deployments/${d.id}`), "Deployment removed.")) rerender();
        }, "secondary", { "aria-label": `Remove deployment ${d.resolved_model} of ${m.name}` }))))
      : "—");
    const rowActions = (m) => h("div", { class: "actions" },
      button("Edit", async () => {
        const out = await act(() => api("GET", `/admin/models/${m.id}`));
        if (!out) return;
        editingModel = { entity: out.data, etag: out.headers.get("etag") };
        await rerender();
        document.getElementById("model-name").focus();
      }, "secondary", { "aria-label": `Edit model ${m.name}` }),
      button("Restrictions", async () => {
        const out = await act(() => api("GET", `/admin/models/${m.id}`));
        if (!out) return;
        editingRestrictions = { entity: out.data, etag: out.headers.get("etag") };
        await rerender();
        document.getElementById("restrictions-title").focus();
      }, "secondary", { "aria-label": `Edit restrictions of model ${m.name}` }),
      button("Onboarding", async () => {
        const out = await act(() => api("GET", `/admin/models/${m.id}`));
        if (!out) return;
        editingOnboarding = { entity: out.data, etag: out.headers.get("etag") };
        await rerender();
        document.getElementById("onboarding-title").focus();
      }, "secondary", { "aria-label": `Onboarding of model ${m.name}` }),
      ["staged", "limited"].includes(m.status) ? button("Graduate", () => graduateModel(m), "", { "aria-label": `Graduate model ${m.name}` }) : null,
      // A staged or limited model goes live by graduating (which clears its roster), not by a status.
      SERVICE_STATUSES.filter((x) => x !== (m.status || "active") && !(x === "active" && ["staged", "limited"].includes(m.status))).map((x) =>
        button({ active: "Reactivate", blocked: "Block", retired: "Retire" }[x], () => setModelStatus(m, x),
          x === "active" ? "secondary" : "danger", { "aria-label": `${{ active: "Reactivate", blocked: "Block", retired: "Retire" }[x]} model ${m.name}` })),
      button("Delete", () => deleteModel(m), "danger", { "aria-label": `Delete model ${m.name}` }));
    const problemsBox = h("div", { id: "model-problems", role: "alert", tabindex: "-1", hidden: true });
    if (modelProblems) problemList(problemsBox, modelProblems.problems, modelProblems.title);
    page("Models",
      state.providers.length === 0 ? h("p", {}, "Add a provider first: ", h("a", { href: "#/providers" }, "Providers"), ".") : null,
      editingRestrictions ? [h("h2", { id: "restrictions-title", tabindex: "-1" }, `Restrictions of model ${editingRestrictions.entity.name}`),
        h("p", { class: "muted" }, "A refused caller gets the same 404 as for an unknown model; the log row says which restriction refused."),
        restrictionsForm()] : null,
      problemsBox,
      editingOnboarding ? onboardingPanel() : null,
      h("h2", { id: "model-form-title" }, editingModel ? `Edit model ${editingModel.entity.name}` : "Add a model"),
      state.providers.length ? modelForm() : null,
      h("h2", {}, "Models"),
      table("Models", [
        { key: "name", label: "Name" }, { key: "provider_name", label: "Provider" }, { key: "resolved_model", label: "Resolved model" },
        { key: "kind", label: "Kind" },
        { key: "status", label: "Status", render: (m) => h("span", { class: `badge ${statusClass(m.status)}` }, m.status) },
        { key: "onboarding", label: "Onboarding", render: onboardingText },
        { key: "input_price_per_1k_tokens", label: "Input / 1k", num: true },
        { key: "output_price_per_1k_tokens", label: "Output / 1k", num: true },
        { key: "caps", label: "Capabilities", render: caps },
        { key: "restrictions", label: "Restrictions", render: (m) => restrictionsText(m.restrictions) },
        { key: "restrictions_revisions", label: "Restrictions enforced", render: (m) => revisionCell(m.restrictions_revisions) },
        { key: "deployments", label: "Extra deployments", render: deployments },
        { key: "actions", label: "Actions", render: rowActions },
      ], state.models, { id: "models-table", rowData: (m) => ({ modelId: m.id, name: m.name, status: m.status || "active" }) }),
      state.models.length ? [h("h2", { id: "deployment-title" }, "Add a deployment (failover)"), deploymentForm()] : null);
  }

  // --- model onboarding: staged, limited to a roster, graduated ---------------------------------

  function limitedText(l) {
    if (!l) return "";
    const parts = [];
    if (l.amount_usd !== undefined && l.amount_usd !== null) parts.push(`$${l.amount_usd} ${l.window || ""}`.trim());
    if (l.expires_at) parts.push(`until ${when(l.expires_at)}`);
    return parts.join(", ");
  }

  function onboardingText(m) {
    if (m.status === "staged") return "Staged: served to no one";
    if (m.status !== "limited") return "—";
    const roster = (m.roster || []).map(userLabel);
    const terms = limitedText(m.limited);
    return h("span", { dataset: { roster: String(roster.length) } },
      `Limited to ${roster.length ? roster.join(", ") : "no one"}`, terms ? ` (${terms})` : "");
  }

  async function graduateModel(m) {
    if (!confirmed(`Graduate model ${m.name}? It becomes active for everyone granted it, and its roster is cleared.`)) return;
    modelProblems = null;
    const out = await act(() => api("POST", `/admin/models/${m.id}/graduate`), `Model ${m.name} graduated: it is active.`);
    if (out) {
      if (editingOnboarding && editingOnboarding.entity.id === m.id) editingOnboarding = null;
      rerender();
    }
  }

  // A delete that a live control still references is refused with 409 model_in_use naming them.
  async function deleteModel(m) {
    if (!confirmed(`Delete model ${m.name}?`)) return;
    try {
      await api("DELETE", `/admin/models/${m.id}`);
    } catch (err) {
      if (err.status === 401) return;
      if (err.code === "model_in_use") {
        const controls = (err.body && (err.body.controls || err.body.references)) || [];
        modelProblems = { title: `Model ${m.name} is in use and was not deleted: these live controls reference it. Change or remove them first.`,
          problems: controls.length ? controls.map(controlText) : [err.message] };
      } else {
        modelProblems = { title: `Model ${m.name} was not deleted (${err.code}):`, problems: problemsOf(err) };
      }
      await rerender();
      document.getElementById("model-problems").focus();
      return;
    }
    modelProblems = null;
    toast(`Model ${m.name} deleted.`);
    rerender();
  }

  // A control named in a refusal: a string, or {kind, id, name}.
  function controlText(c) {
    if (typeof c === "string") return c;
    if (!c || typeof c !== "object") return String(c);
    const kind = c.kind || c.type || "control";
    const name = c.name || c.id || c.target || "";
    return `${kind} ${name}${c.detail ? ` (${c.detail})` : ""}`.trim();
  }

  function onboardingPanel() {
    const m = editingOnboarding.entity;
    const l = m.limited || {};
    const problemsBox = h("div", { id: "onboarding-problems", role: "alert", tabindex: "-1", hidden: true });
    const form = h("form", { class: "grid panel", id: "onboarding-form", "aria-labelledby": "onboarding-title", novalidate: true },
      field("Onboarding status", "status", { kind: "select", id: "onboarding-status", value: ["staged", "limited"].includes(m.status) ? m.status : "limited",
        options: [["staged", "staged (served to no one)"], ["limited", "limited (served to its roster only)"]] }),
      field("Roster", "roster", { kind: "textarea", rows: 3, id: "onboarding-roster", value: peopleText(m.roster), hint: "People by email, one a line: who a limited model serves" }),
      h("fieldset", {}, h("legend", {}, "Limited terms"),
        field("Spend window", "window", { kind: "select", id: "onboarding-window", value: l.window || "daily", options: WINDOWS.map((w) => [w, w]) }),
        field("Amount per person (USD)", "amount_usd", { id: "onboarding-amount", inputmode: "decimal", value: l.amount_usd, hint: "Empty: no amount limit" }),
        field("Terms expire", "expires_at", { kind: "datetime-local", id: "onboarding-expires", value: l.expires_at ? localInput(new Date(l.expires_at)) : "", hint: "Empty: no expiry" })),
      h("div", { class: "actions" },
        h("button", { type: "submit", id: "onboarding-submit" }, "Save onboarding"),
        button("Graduate to active", () => graduateModel(m), "", { id: "onboarding-graduate" }),
        button("Cancel", () => { editingOnboarding = null; rerender(); }, "secondary", { id: "onboarding-cancel" })));
    form.addEventListener("submit", async (ev) => {
      ev.preventDefault();
      const d = formData(form);
      // A roster and terms belong to a limited model; a staged one has neither.
      const body = { status: d.status };
      if (d.status === "limited") {
        body.roster = peopleIds(d.roster);
        body.limited = { window: d.window, amount_usd: d.amount_usd === "" ? null : d.amount_usd, expires_at: d.expires_at ? isoFromLocal(d.expires_at) : null };
      }
      let out;
      try {
        out = await api("PUT", `/admin/models/${m.id}`, body, { "if-match": editingOnboarding.etag });
      } catch (err) {
        if (err.status === 401) return;
        problemList(problemsBox, problemsOf(err), `The onboarding was refused (${err.code}):`);
        problemsBox.focus();
        return;
      }
      toast(pendingChange(out) ? submittedText(out) : `Model ${m.name} is ${d.status}.`);
      editingOnboarding = null;
      rerender();
    });
    return h("section", { id: "onboarding", "aria-labelledby": "onboarding-title" },
      h("h2", { id: "onboarding-title", tabindex: "-1" }, `Onboarding of model ${m.name}`),
      h("p", { class: "muted" }, `Now ${m.status}. A staged model answers callers as an unknown one; a limited one serves only its roster, on its terms; graduating makes it active and clears the roster.`),
      form, problemsBox);
  }

  // --- model restrictions (who may see a model) -----------------------------------------------

  let editingRestrictions = null; // {entity, etag}

  function restrictionsText(r) {
    if (!r) return "None";
    const parts = [];
    if ((r.leader_deny || []).length) parts.push(`denied to the organisations of ${r.leader_deny.map(userLabel).join(", ")}`);
    if (r.leader_allow) parts.push(`only the organisations of ${r.leader_allow.map(userLabel).join(", ") || "no one"}`);
    if ((r.business_units_closed || []).length) parts.push(`closed to ${r.business_units_closed.join(", ")}`);
    if (r.business_units_open) parts.push(`open only to ${r.business_units_open.join(", ") || "no unit"}`);
    if ((r.exempt || []).length) parts.push(`exempt: ${r.exempt.map(userLabel).join(", ")}`);
    return parts.join("; ") || "None";
  }

  function restrictionsForm() {
    const m = editingRestrictions.entity;
    const r = m.restrictions || {};
    const people = "People by email, one a line";
    const problemsBox = h("div", { id: "restrictions-problems", role: "alert", tabindex: "-1", hidden: true });
    const form = h("form", { class: "grid panel", id: "restrictions-form", "aria-labelledby": "restrictions-title", novalidate: true },
      field("Leaders denied (with their organisations)", "leader_deny", { kind: "textarea", id: "restrict-deny", rows: 2, value: peopleText(r.leader_deny), hint: people }),
      h("fieldset", {}, h("legend", {}, "Leader allow list"),
        field("Only the organisations of these leaders", "allow_on", { kind: "checkbox", id: "restrict-allow-on", value: r.leader_allow !== null && r.leader_allow !== undefined }),
        field("Leaders allowed", "leader_allow", { kind: "textarea", id: "restrict-allow", rows: 2, value: peopleText(r.leader_allow), hint: people })),
      field("Exempt people (always allowed)", "exempt", { kind: "textarea", id: "restrict-exempt", rows: 2, value: peopleText(r.exempt), hint: people }),
      field("Business units closed", "business_units_closed", { id: "restrict-bu-closed", value: (r.business_units_closed || []).join(", "), hint: "Comma separated" }),
      h("fieldset", {}, h("legend", {}, "Business unit allow list"),
        field("Only these business units", "open_on", { kind: "checkbox", id: "restrict-open-on", value: r.business_units_open !== null && r.business_units_open !== undefined }),
        field("Business units open", "business_units_open", { id: "restrict-bu-open", value: (r.business_units_open || []).join(", "), hint: "Comma separated" })),
      h("div", { class: "actions" },
        h("button", { type: "submit", id: "restrictions-submit" }, "Save restrictions"),
        button("Remove all restrictions", () => put(null), "danger", { id: "restrictions-clear" }),
        button("Cancel", () => { editingRestrictions = null; rerender(); }, "secondary")));
    async function put(restrictions) {
      let out;
      try {
        out = await api("PUT", `/admin/models/${m.id}`, { restrictions }, { "if-match": editingRestrictions.etag });
      } catch (err) {
        if (err.status === 401) return;
        problemList(problemsBox, problemsOf(err), `The restrictions were refused (${err.code}):`);
        problemsBox.focus();
        return;
      }
      toast(pendingChange(out) ? submittedText(out) : restrictions ? `Restrictions of ${m.name} saved.` : `Restrictions of ${m.name} removed.`);
      editingRestrictions = null;
      rerender();
    }
    form.addEventListener("submit", (ev) => {
      ev.preventDefault();
      const d = formData(form);
      put({
        leader_deny: peopleIds(d.leader_deny), leader_allow: d.allow_on ? peopleIds(d.leader_allow) : null,
        exempt: peopleIds(d.exempt), business_units_closed: labelList(d.business_units_closed),
        business_units_open: d.open_on ? labelList(d.business_units_open) : null,
      });
    });
    return [form, problemsBox];
  }

  // --- access and policies -------------------------------------------------------------------

  let accessUser = "";
  let editingPolicy = null; // model_id

  // One grant's policy; path: the principal's (/admin/users/{id} or /admin/applications/{id});
  // done(): after saving or cancelling (closes the form and renders again).
  function policyForm(path, p, done) {
    const days = new Set(p.active_days || [0, 1, 2, 3, 4, 5, 6]);
    const hhmm = (v) => (v ? String(v).slice(0, 5) : "");
    const form = h("form", { class: "grid panel", id: "policy-form", "aria-labelledby": "policy-title" },
      h("h3", { id: "policy-title" }, `Policy for ${p.model_name}`),
      field("Daily cap (USD)", "daily_cap_usd", { inputmode: "decimal", required: true, id: "policy-cap", value: p.daily_cap_usd }),
      field("Max calls per hour", "max_calls_per_hour", { kind: "number", min: 1, id: "policy-hourly", value: p.max_calls_per_hour ?? "", hint: "Empty: no hourly cap" }),
      field("Allowed from", "allowed_from", { kind: "time", id: "policy-from", value: hhmm(p.allowed_from), hint: "Empty: no hour window" }),
      field("Allowed to", "allowed_to", { kind: "time", id: "policy-to", value: hhmm(p.allowed_to) }),
      field("Time zone", "timezone", { required: true, id: "policy-tz", value: p.timezone || "UTC", hint: "IANA name, e.g. Europe/Paris" }),
      h("fieldset", {}, h("legend", {}, "Active days"), h("div", { class: "days" },
        DAYS.map((d, i) => field(d, `day-${i}`, { kind: "checkbox", id: `policy-day-${i}`, value: days.has(i) })))),
      field("Always open (ignore days and hours)", "always_open", { kind: "checkbox", id: "policy-always", value: p.always_open }),
      h("div", { class: "actions" }, h("button", { type: "submit", id: "policy-submit" }, "Save policy"),
        button("Cancel", done, "secondary")));
    form.addEventListener("submit", async (ev) => {
      ev.preventDefault();
      const d = formData(form);
      const body = {
        daily_cap_usd: Number(d.daily_cap_usd), max_calls_per_hour: d.max_calls_per_hour ? Number(d.max_calls_per_hour) : null,
        allowed_from: d.allowed_from || null, allowed_to: d.allowed_to || null, timezone: d.timezone || "UTC",
        active_days: DAYS.map((_, i) => i).filter((i) => d[`day-${i}`]), always_open: d.always_open,
      };
      if (await act(() => api("PUT", `${path}/policies/${p.model_id}`, body), `Policy for ${p.model_name} saved.`)) done();
    });
    return form;
  }

  const policyDays = (p) => ((p.active_days || []).length === 7 ? "Every day" : (p.active_days || []).map((d) => DAYS[d]).join(", ") || "None");
  const policyWindow = (p) => (p.always_open ? "Always open" : p.allowed_from && p.allowed_to
    ? `${String(p.allowed_from).slice(0, 5)}–${String(p.allowed_to).slice(0, 5)} ${p.timezone}` : `Any hour (${p.timezone})`);

  async function renderAccess() {
    await loadRegistry();
    if (accessUser && !state.users.some((u) => u.id === accessUser)) accessUser = "";
    if (!accessUser && state.users.length) accessUser = state.users[0].id;
    const policies = accessUser ? await get(`/admin/users/${accessUser}/policies`) : [];
    const userSelect = h("select", { id: "access-user", name: "user" }, state.users.map((u) => h("option", { value: u.id, selected: u.id === accessUser }, u.email)));
    userSelect.addEventListener("change", () => { accessUser = userSelect.value; editingPolicy = null; rerender(); });
    const granted = new Set(policies.map((p) => p.model_id));
    const grantForm = h("form", { class: "toolbar", id: "grant-form", "aria-label": "Grant access" },
      field("Model", "model_id", { kind: "select", id: "grant-model", options: state.models.filter((m) => !granted.has(m.id)).map((m) => [m.id, m.name]) }),
      h("button", { type: "submit", id: "grant-submit", disabled: state.models.every((m) => granted.has(m.id)) }, "Grant access"));
    grantForm.addEventListener("submit", async (ev) => {
      ev.preventDefault();
      const model_id = grantForm.elements.model_id.value;
      if (await act(() => api("POST", "/admin/access", { user_id: accessUser, model_id }), "Access granted.")) rerender();
    });
    const rowActions = (p) => h("div", { class: "actions" },
      button("Edit policy", async () => { editingPolicy = p.model_id; await rerender(); document.getElementById("policy-cap").focus(); }, "secondary", { "aria-label": `Edit policy for ${p.model_name}` }),
      button("Revoke access", async () => {
        if (!confirmed(`Revoke access to ${p.model_name}?`)) return;
        if (await act(() => api("DELETE", "/admin/access", { user_id: accessUser, model_id: p.model_id }), "Access revoked.")) rerender();
      }, "danger", { "aria-label": `Revoke access to ${p.model_name}` }));
    const editing = policies.find((p) => p.model_id === editingPolicy);
    page("Access & policies",
      state.users.length === 0 ? h("p", {}, "Create a user first: ", h("a", { href: "#/users" }, "Users & keys"), ".") : [
        h("div", { class: "toolbar" }, h("div", { class: "field" }, h("label", { for: "access-user" }, "User"), userSelect)),
        h("h2", {}, "Grant a model"), grantForm,
        editing ? policyForm(`/admin/users/${accessUser}`, editing, () => { editingPolicy = null; rerender(); }) : null,
        h("h2", {}, "Granted models and their policies"),
        table("Grants and policies", [
          { key: "model_name", label: "Model" },
          { key: "daily_cap_usd", label: "Daily cap (USD)", num: true },
          { key: "max_calls_per_hour", label: "Calls/hour", num: true, render: (p) => p.max_calls_per_hour ?? "No cap" },
          { key: "window", label: "Hours", render: policyWindow },
          { key: "days", label: "Days", render: policyDays },
          { key: "actions", label: "Actions", render: rowActions },
        ], policies, { id: "policies-table", empty: "No models granted.", rowData: (p) => ({ modelId: p.model_id, name: p.model_name }) }),
      ]);
  }

  // --- gateway: status and kill switch --------------------------------------------------------

  async function renderGateway() {
    const status = await get("/admin/status");
    const tripped = !!status.kill_switch;
    const isSuper = !!(state.me && state.me.is_super_admin);
    page("Gateway",
      h("section", { class: "panel", "aria-labelledby": "kill-title" },
        h("h2", { id: "kill-title" }, "Kill switch"),
        h("p", { id: "kill-state", dataset: { tripped: String(tripped) } },
          tripped ? "The gateway is paused: every call is refused with 503 paused_by_admin." : "The gateway is serving calls."),
        isSuper ? button(tripped ? "Resume the gateway" : "Pause the gateway (kill switch)", async () => {
          if (!tripped && !confirmed("Pause the gateway? Every call will be refused until you resume it.")) return;
          if (await act(() => api("POST", "/admin/kill-switch", { tripped: !tripped }), tripped ? "Gateway resumed." : "Gateway paused.")) rerender();
        }, tripped ? "" : "danger", { id: "kill-toggle" })
          : h("p", { class: "muted" }, "Only a super admin can pause or resume the gateway.")),
      h("h2", {}, "This worker"),
      table("Worker status", [{ key: "k", label: "Item" }, { key: "v", label: "Value" }], [
        ["Process id", status.pid], ["Config sequence", status.config_seq], ["Draining", status.draining ? "yes" : "no"],
        ["Requests in flight", status.in_flight], ["Request limit", status.request_limit ?? "none"],
        ["Admission load", status.admission ? `${status.admission.in_flight} / ${status.admission.capacity} (load ${status.admission.load_factor})` : "—"],
        ["Gateway pool", status.gateway_pool ? `${status.gateway_pool.size} open, ${status.gateway_pool.idle} idle, max ${status.gateway_pool.max}` : "—"],
        ["Admin pool", status.admin_pool ? `${status.admin_pool.size} open, ${status.admin_pool.idle} idle, max ${status.admin_pool.max}` : "—"],
      ].map(([k, v]) => ({ k, v: String(v ?? "—") })), { id: "status-table" }),
      h("h2", {}, "Instances"),
      h("p", { class: "muted" }, status.instance && status.instance.mode === "cluster"
        ? "Several instances share this database: caps and provider limits are leased to them in slices."
        : "One instance: it holds every cap whole."),
      table("Instances of this cluster", [
        { key: "host", label: "Host", render: (i) => `${i.host}:${i.port}` },
        { key: "id", label: "Id", render: (i) => h("span", {}, h("code", {}, i.id.slice(0, 8)), status.instance && i.id === status.instance.id ? " (this one)" : "") },
        { key: "workers", label: "Workers", num: true },
        { key: "mode", label: "Mode" },
        { key: "alive", label: "State", render: (i) => (i.alive ? "alive" : "not seen for 10 s") },
        { key: "started_at", label: "Started", render: (i) => when(i.started_at) },
        { key: "last_seen", label: "Last heartbeat", render: (i) => when(i.last_seen) },
      ], status.instances || [], { id: "instances-table", empty: "The database could not be asked.", rowData: (i) => ({ instance: i.id, alive: String(i.alive) }) }),
      h("p", {}, "Prometheus metrics: ", h("a", { href: "/admin/metrics" }, "/admin/metrics"), ". API description: ", h("a", { href: "/admin/openapi.json" }, "/admin/openapi.json"), "."));
  }

  // --- audit log ---------------------------------------------------------------------------------

  const auditQuery = { actor: "", action: "", from: "", to: "", page: 1, page_size: 25 };

  async function renderAudit() {
    const params = new URLSearchParams({ page: auditQuery.page, page_size: auditQuery.page_size });
    if (auditQuery.actor) params.set("actor", auditQuery.actor);
    if (auditQuery.action) params.set("action", auditQuery.action);
    if (auditQuery.from) params.set("from", isoFromLocal(auditQuery.from));
    if (auditQuery.to) params.set("to", isoFromLocal(auditQuery.to));
    const out = await get(`/admin/audit?${params}`);
    const pages = Math.max(1, Math.ceil(out.total / out.page_size));
    const form = h("form", { class: "grid panel", id: "audit-filters", "aria-label": "Audit filters" },
      field("Actor", "actor", { value: auditQuery.actor, hint: "Admin email or token:<name>" }),
      field("Action", "action", { value: auditQuery.action, hint: "e.g. create_user, login, update_policy" }),
      field("From", "from", { kind: "datetime-local", value: auditQuery.from }),
      field("To", "to", { kind: "datetime-local", value: auditQuery.to }),
      h("div", { class: "actions" }, h("button", { type: "submit" }, "Apply filters")));
    form.addEventListener("submit", (ev) => { ev.preventDefault(); Object.assign(auditQuery, formData(form), { page: 1 }); rerender(); });
    page("Audit log",
      form,
      h("p", { id: "audit-total", dataset: { total: String(out.total) } }, `${num(out.total)} entries.`),
      table("Admin actions, newest first", [
        { key: "created_at", label: "Time", render: (e) => when(e.created_at) },
        { key: "actor", label: "Actor" }, { key: "action", label: "Action" }, { key: "target", label: "Target" },
        { key: "detail", label: "Detail", render: (e) => (e.detail && Object.keys(e.detail).length ? h("code", {}, JSON.stringify(e.detail)) : "—") },
      ], out.entries, { id: "audit-table", rowData: (e) => ({ action: e.action, actor: e.actor || "" }) }),
      h("nav", { class: "pager", "aria-label": "Audit pages" },
        button("Previous page", () => { auditQuery.page -= 1; rerender(); }, "secondary", { disabled: out.page <= 1 }),
        h("span", {}, `Page ${out.page} of ${pages}`),
        button("Next page", () => { auditQuery.page += 1; rerender(); }, "secondary", { disabled: out.page >= pages })));
  }

  // --- admins and admin API tokens -----------------------------------------------------------

  async function renderAdmins() {
    const [admins, tokens] = await Promise.all([get("/admin/admins"), get("/admin/tokens")]);
    const isSuper = !!(state.me && state.me.is_super_admin);
    const adminForm = h("form", { class: "grid panel", id: "admin-create", "aria-label": "Create an admin" },
      field("Email", "email", { kind: "email", required: true, id: "admin-email" }),
      field("Password", "password", { kind: "password", required: true, autocomplete: "new-password", hint: "At least 8 characters" }),
      isSuper ? field("Super admin", "is_super", { kind: "checkbox" }) : null,
      h("div", { class: "actions" }, h("button", { type: "submit" }, "Create admin")));
    adminForm.addEventListener("submit", async (ev) => {
      ev.preventDefault();
      const d = formData(adminForm);
      const body = { email: d.email, password: d.password };
      if (isSuper) body.is_super = d.is_super;
      if (await act(() => api("POST", "/admin/admins", body), `Admin ${d.email} created.`)) rerender();
    });
    const tokenForm = h("form", { class: "grid panel", id: "token-create", "aria-label": "Create an admin API token" },
      field("Token name", "name", { required: true, id: "token-name" }),
      isSuper ? field("Super-admin rights", "is_super", { kind: "checkbox" }) : null,
      h("div", { class: "actions" }, h("button", { type: "submit" }, "Create token")));
    tokenForm.addEventListener("submit", async (ev) => {
      ev.preventDefault();
      const d = formData(tokenForm);
      const body = { name: d.name };
      if (isSuper) body.is_super = d.is_super;
      const out = await act(() => api("POST", "/admin/tokens", body), `Token ${d.name} created.`);
      if (out) { showSecret(`Admin API token ${out.data.name}`, out.data.token, "Use it as Authorization: Bearer <token>. It is shown only once."); await renderAdmins(); document.getElementById("copy-secret").focus(); }
    });
    const pwForm = h("form", { class: "grid panel", id: "password-change", "aria-label": "Change your password" },
      field("Current password", "old_password", { kind: "password", required: true, autocomplete: "current-password" }),
      field("New password", "new_password", { kind: "password", required: true, autocomplete: "new-password", hint: "At least 8 characters" }),
      h("div", { class: "actions" }, h("button", { type: "submit" }, "Change password")));
    pwForm.addEventListener("submit", async (ev) => {
      ev.preventDefault();
      if (await act(() => api("POST", "/admin/change-password", formData(pwForm)), "Password changed; your other sessions were closed.")) pwForm.reset();
    });
    const adminActions = (a) => (isSuper && a.email !== state.me.email ? h("div", { class: "actions" },
      a.status === "active"
        ? button("Pause", async () => { if (await act(() => api("POST", `/admin/admins/${a.id}/pause`), `${a.email} paused.`)) rerender(); }, "secondary", { "aria-label": `Pause ${a.email}` })
        : button("Resume", async () => { if (await act(() => api("POST", `/admin/admins/${a.id}/resume`), `${a.email} resumed.`)) rerender(); }, "secondary", { "aria-label": `Resume ${a.email}` }),
      button("Delete", async () => {
        if (!confirmed(`Delete admin ${a.email}?`)) return;
        if (await act(() => api("DELETE", `/admin/admins/${a.id}`), `${a.email} deleted.`)) rerender();
      }, "danger", { "aria-label": `Delete admin ${a.email}` })) : "—");
    const tokenActions = (t) => (t.revoked_at ? "Revoked" : button("Revoke", async () => {
      if (!confirmed(`Revoke token ${t.name}?`)) return;
      if (await act(() => api("DELETE", `/admin/tokens/${t.id}`), `Token ${t.name} revoked.`)) rerender();
    }, "danger", { "aria-label": `Revoke token ${t.name}` }));
    page("Admins & tokens",
      secretPanel(),
      h("h2", {}, "Admins"),
      table("Dashboard admins", [
        { key: "email", label: "Email" }, { key: "status", label: "Status" },
        { key: "is_super", label: "Super admin", render: (a) => (a.is_super ? "yes" : "no") },
        { key: "created_by", label: "Created by" }, { key: "created_at", label: "Created", render: (a) => when(a.created_at) },
        { key: "actions", label: "Actions", render: adminActions },
      ], admins, { id: "admins-table", rowData: (a) => ({ email: a.email }) }),
      h("h3", {}, "Create an admin"), adminForm,
      h("h2", {}, "Admin API tokens"),
      table("Tokens for automation", [
        { key: "name", label: "Name" }, { key: "is_super", label: "Super-admin rights", render: (t) => (t.is_super ? "yes" : "no") },
        { key: "created_by", label: "Created by" }, { key: "created_at", label: "Created", render: (t) => when(t.created_at) },
        { key: "actions", label: "Actions", render: tokenActions },
      ], tokens, { id: "tokens-table", rowData: (t) => ({ name: t.name }) }),
      h("h3", {}, "Create a token"), tokenForm,
      h("h2", {}, "Your password"), pwForm);
  }

  // --- identity providers: platform token issuers, and a short-lived token for oneself --------

  async function renderIdentity() {
    const issuers = await get("/admin/issuers");
    const isSuper = !!(state.me && state.me.is_super_admin);
    const form = h("form", { class: "grid panel", id: "issuer-create", "aria-label": "Trust a token issuer" },
      field("Issuer (iss)", "issuer", { required: true, id: "issuer-iss", placeholder: "https://login.example.com/" }),
      field("Audiences (aud)", "audiences", { required: true, id: "issuer-aud", hint: "One or more, comma separated" }),
      field("Algorithms", "algorithms", { id: "issuer-alg", value: "RS256", hint: "RS256, ES256, EdDSA; comma separated" }),
      field("JWKS URL", "jwks_url", { id: "issuer-url", hint: "Fetched in the background; or paste a JWK Set below" }),
      field("JWK Set (JSON)", "jwks", { kind: "textarea", rows: 4, id: "issuer-jwks" }),
      field("Email claim", "email_claim", { id: "issuer-email", value: "email" }),
      field("Business unit claim", "business_unit_claim", { id: "issuer-bu" }),
      field("Tier claim", "tier_claim", { id: "issuer-tier" }),
      field("Manager email claim", "manager_claim", { id: "issuer-manager" }),
      field("Clock skew (s)", "clock_skew_s", { kind: "number", id: "issuer-skew", value: "60", min: 0 }),
      field("Provision unknown people from their claims", "jit_provisioning", { kind: "checkbox", id: "issuer-jit" }),
      field("The JWKS URL is a private address", "local", { kind: "checkbox", id: "issuer-local" }),
      h("div", { class: "actions" }, h("button", { type: "submit" }, "Trust issuer")));
    form.addEventListener("submit", async (ev) => {
      ev.preventDefault();
      const d = formData(form);
      const list = (v) => String(v || "").split(",").map((x) => x.trim()).filter(Boolean);
      const claims = { email: d.email_claim || "email" };
      if (d.business_unit_claim) claims.business_unit = d.business_unit_claim;
      if (d.tier_claim) claims.tier = d.tier_claim;
      if (d.manager_claim) claims.manager_email = d.manager_claim;
      const body = { issuer: d.issuer, audiences: list(d.audiences), algorithms: list(d.algorithms), claims,
        clock_skew_s: Number(d.clock_skew_s || 60), jit_provisioning: !!d.jit_provisioning, local: !!d.local };
      if (d.jwks_url) body.jwks_url = d.jwks_url;
      if (d.jwks) {
        try { body.jwks = JSON.parse(d.jwks); } catch { toast("The JWK Set is not JSON.", true); return; }
      }
      if (await act(() => api("POST", "/admin/issuers", body), `Issuer ${d.issuer} trusted.`)) rerender();
    });
    const actions = (i) => (isSuper ? button("Remove", async () => {
      if (!confirmed(`Stop trusting ${i.issuer}? Its tokens are refused at once.`)) return;
      if (await act(() => api("DELETE", `/admin/issuers/${i.id}`), `Issuer ${i.issuer} removed.`)) rerender();
    }, "danger", { "aria-label": `Remove issuer ${i.issuer}` }) : "—");
    const mint = button("Get a data-plane token", async () => {
      const out = await act(() => api("POST", "/admin/session-token"));
      if (out) {
        showSecret("Your data-plane token", out.data.token,
          `Use it as Authorization: Bearer <token> (or as the SDK's API key) for ${Math.round(out.data.expires_in / 60)} minutes.`);
        await renderIdentity();
        document.getElementById("copy-secret").focus();
      }
    }, "", { id: "session-token" });
    page("Identity providers",
      secretPanel(),
      h("p", {}, "Platform tokens (JWTs) from these issuers call the data plane; they are verified offline against the issuer's keys."),
      table("Trusted token issuers", [
        { key: "issuer", label: "Issuer" }, { key: "audiences", label: "Audiences", render: (i) => i.audiences.join(", ") },
        { key: "algorithms", label: "Algorithms", render: (i) => i.algorithms.join(", ") },
        { key: "keys", label: "Keys", render: (i) => (i.keys.length ? i.keys.map((k) => `${k.kid || "(no kid)"} ${k.alg}`).join(", ") : "none yet") },
        { key: "source", label: "Key set", render: (i) => (i.jwks_url ? `${i.jwks_url}${i.fetch_error ? ` (last fetch failed: ${i.fetch_error})` : i.fetched_at ? ` (fetched ${when(i.fetched_at)})` : ""}` : "inline") },
        { key: "jit", label: "Just in time", render: (i) => (i.jit_provisioning ? "yes" : "no") },
        { key: "actions", label: "Actions", render: actions },
      ], issuers, { id: "issuers-table", rowData: (i) => ({ issuer: i.issuer }) }),
      isSuper ? h("h2", {}, "Trust an issuer") : null, isSuper ? form : null,
      h("h2", {}, "A token for yourself"),
      h("p", {}, "A short-lived token for the user with your email, for developer tools: no long-lived key needed."),
      h("div", { class: "actions" }, mint));
  }

  // --- workflow budgets: calls tagged workflow=<id> reserve against them ----------------------

  async function renderWorkflows() {
    const [workflows] = await Promise.all([get("/admin/workflows"), loadRegistry()]);
    const form = h("form", { class: "grid panel", id: "workflow-create", "aria-label": "Register a workflow budget" },
      field("Workflow id", "id", { required: true, id: "workflow-id", hint: "The value callers send as workflow=<id> in X-Meshfast-Tags" }),
      field("Limit (USD)", "limit_usd", { required: true, id: "workflow-limit", inputmode: "decimal" }),
      field("Window", "window", { kind: "select", id: "workflow-window", options: [["daily", "Daily"], ["weekly", "Weekly"], ["monthly", "Monthly"]] }),
      field("People who may charge it", "people", { kind: "textarea", rows: 2, id: "workflow-people", hint: "Emails, one a line; empty with no business unit: anyone" }),
      field("Business units who may charge it", "units", { id: "workflow-units", hint: "Comma separated" }),
      h("div", { class: "actions" }, h("button", { type: "submit" }, "Register workflow")));
    form.addEventListener("submit", async (ev) => {
      ev.preventDefault();
      const d = formData(form);
      const principals = [...peopleIds(d.people).map((id) => ({ user_id: id })), ...labelList(d.units).map((bu) => ({ business_unit: bu }))];
      const body = { id: d.id, limit_usd: d.limit_usd, window: d.window };
      if (principals.length) body.principals = principals;
      if (await act(() => api("POST", "/admin/workflows", body), `Workflow ${d.id} registered.`)) rerender();
    });
    const who = (w) => (w.principals === null ? "anyone" : w.principals.map((p) => (p.user_id ? userLabel(p.user_id) : p.business_unit)).join(", "));
    page("Workflows",
      h("p", {}, "Calls tagged workflow=<id> (X-Meshfast-Tags) are reserved against a registered workflow's budget like any cap; an id nobody registered is attribution only."),
      table("Workflow budgets", [
        { key: "id", label: "Workflow" }, { key: "window", label: "Window" },
        { key: "spent", label: "Spent / limit", render: (w) => `${usd(w.spent_usd)} / ${usd(w.limit_usd)}` },
        { key: "who", label: "May charge it", render: who },
        { key: "actions", label: "Actions", render: (w) => button("Unregister", async () => {
          if (!confirmed(`Unregister ${w.id}? Its calls become attribution only.`)) return;
          if (await act(() => api("DELETE", `/admin/workflows/${encodeURIComponent(w.id)}`), `Workflow ${w.id} unregistered.`)) rerender();
        }, "danger", { "aria-label": `Unregister workflow ${w.id}` }) },
      ], workflows, { id: "workflows-table", rowData: (w) => ({ workflow: w.id }) }),
      h("h2", {}, "Register a workflow"), form);
  }

  // --- applications: services calling on their own behalf, with an owner, keys, grants, policies --

  let openApplication = null; // the id of the application whose grants and keys are shown
  let editingAppPolicy = null; // model_id

  // One application's grants (with their policies) and keys.
  function applicationDetail(a, keys, policies) {
    const path = `/admin/applications/${a.id}`;
    const close = () => { openApplication = null; editingAppPolicy = null; rerender(); };
    const granted = new Set(policies.map((p) => p.model_id));
    const grantable = state.models.filter((m) => !granted.has(m.id));
    const grantForm = h("form", { class: "toolbar", id: "app-grant-form", "aria-label": `Grant ${a.name} a model` },
      field("Model", "model_id", { kind: "select", id: "app-grant-model", options: grantable.map((m) => [m.id, m.name]),
        hint: grantable.length ? null : "Every model is granted already." }),
      h("button", { type: "submit", id: "app-grant-submit", disabled: grantable.length === 0 }, "Grant access"));
    grantForm.addEventListener("submit", async (ev) => {
      ev.preventDefault();
      const model_id = grantForm.elements.model_id.value;
      if (!model_id) return;
      if (await act(() => api("POST", "/admin/access", { application_id: a.id, model_id }), `Access granted to ${a.name}.`)) rerender();
    });
    const rowActions = (p) => h("div", { class: "actions" },
      button("Edit policy", async () => { editingAppPolicy = p.model_id; await rerender(); document.getElementById("policy-cap").focus(); },
        "secondary", { "aria-label": `Edit policy for ${p.model_name}` }),
      button("Revoke access", async () => {
        if (!confirmed(`Revoke the access of ${a.name} to ${p.model_name}?`)) return;
        if (await act(() => api("DELETE", "/admin/access", { application_id: a.id, model_id: p.model_id }), "Access revoked.")) rerender();
      }, "danger", { "aria-label": `Revoke access to ${p.model_name}` }));
    const editing = policies.find((p) => p.model_id === editingAppPolicy);
    return h("section", { class: "panel", id: "application-detail", "aria-labelledby": "application-detail-title" },
      h("h2", { id: "application-detail-title", tabindex: "-1" }, `Grants and keys of ${a.name}`),
      a.status === "active" ? null
        : h("p", { class: "error-text" }, "This application is revoked: its keys and tokens are refused until it is reactivated."),
      h("h3", {}, "Grant a model"), grantForm,
      editing ? policyForm(path, editing, () => { editingAppPolicy = null; rerender(); }) : null,
      table(`Models granted to ${a.name} and their policies`, [
        { key: "model_name", label: "Model" },
        { key: "daily_cap_usd", label: "Daily cap (USD)", num: true },
        { key: "max_calls_per_hour", label: "Calls/hour", num: true, render: (p) => p.max_calls_per_hour ?? "No cap" },
        { key: "window", label: "Hours", render: policyWindow },
        { key: "days", label: "Days", render: policyDays },
        { key: "actions", label: "Actions", render: rowActions },
      ], policies, { id: "app-policies-table", empty: "No models granted.", rowData: (p) => ({ modelId: p.model_id, name: p.model_name }) }),
      keysPanel({ label: a.name, path, grantee: "the application", keys, reload: rerender, close, closeLabel: "Close the application" }));
  }

  async function renderApplications() {
    const [apps] = await Promise.all([get("/admin/applications"), loadRegistry()]);
    const list = apps || [];
    const open = list.find((a) => a.id === openApplication) || null;
    if (!open) { openApplication = null; editingAppPolicy = null; }
    const [keys, policies] = open
      ? await Promise.all([get(`/admin/applications/${open.id}/keys`), get(`/admin/applications/${open.id}/policies`)]) : [[], []];

    const problemsBox = h("div", { id: "application-problems", role: "alert", tabindex: "-1", hidden: true });
    const form = h("form", { class: "grid panel", id: "application-create", "aria-labelledby": "application-create-title" },
      field("Application name", "name", { required: true, id: "application-name", hint: "Up to 64 of letters, digits, spaces and . _ -; unique" }),
      field("Owner", "owner_id", { kind: "select", required: true, id: "application-owner", hint: "The person who answers for it",
        options: [["", "Choose a person…"], ...state.users.map((u) => [u.id, u.email])] }),
      field("Business unit", "business_unit", { id: "application-bu", hint: "Optional" }),
      h("div", { class: "actions" }, h("button", { type: "submit", id: "application-create-submit" }, "Create application and key")));
    form.addEventListener("submit", async (ev) => {
      ev.preventDefault();
      const d = formData(form);
      const body = { name: d.name, owner_id: d.owner_id };
      if (d.business_unit) body.business_unit = d.business_unit;
      let out;
      try {
        out = await api("POST", "/admin/applications", body);
      } catch (err) {
        if (err.status === 401) return;
        problemList(problemsBox, problemsOf(err), `The application was refused (${err.code}):`);
        problemsBox.focus();
        return;
      }
      toast(`Application ${out.data.name} created.`);
      showSecret(`API key for application ${out.data.name}`, out.data.key,
        "Copy it now: it is shown only once and cannot be retrieved later. The application calls with it as Authorization: Bearer <key>.");
      await renderApplications();
      document.getElementById("copy-secret").focus();
    });

    const setStatus = (a, status) => api("PUT", `/admin/applications/${a.id}`, { status }, { "if-match": `"${a.version}"` });
    const rowActions = (a) => h("div", { class: "actions" },
      button("Grants & keys", async () => {
        openApplication = a.id;
        editingAppPolicy = null;
        await rerender();
        document.getElementById("application-detail-title").focus();
      }, "secondary", { "aria-label": `Grants & keys of ${a.name}` }),
      a.status === "active"
        ? button("Revoke", async () => {
          if (!confirmed(`Revoke ${a.name}? Its keys and tokens are refused at once, until it is reactivated.`)) return;
          if (await act(() => setStatus(a, "revoked"), `${a.name} revoked.`)) rerender();
        }, "danger", { "aria-label": `Revoke application ${a.name}` })
        : button("Reactivate", async () => {
          if (await act(() => setStatus(a, "active"), `${a.name} reactivated.`)) rerender();
        }, "secondary", { "aria-label": `Reactivate application ${a.name}` }),
      button("Delete", async () => {
        if (!confirmed(`Delete ${a.name} with its keys, grants and policies? Its keys are refused at once.`)) return;
        if (await act(() => api("DELETE", `/admin/applications/${a.id}`), `${a.name} deleted.`)) rerender();
      }, "danger", { "aria-label": `Delete application ${a.name}` }));

    page("Applications",
      secretPanel(),
      h("p", {}, "Services that call the data plane on their own behalf. Each has an owner who answers for it, and its own keys, grants and per-model policies; its calls are attributed to it, not to a person."),
      table("Applications", [
        { key: "name", label: "Name" },
        { key: "owner_email", label: "Owner" },
        { key: "business_unit", label: "Business unit" },
        { key: "status", label: "Status", render: (a) => h("span", { class: `badge ${a.status === "active" ? "ok" : "bad"}` }, a.status) },
        { key: "key_prefix", label: "Key", render: (a) => (a.key_prefix ? h("code", {}, a.key_prefix) : "—") },
        { key: "created_at", label: "Created", render: (a) => when(a.created_at) },
        { key: "actions", label: "Actions", render: rowActions },
      ], list, { id: "applications-table", empty: "No applications yet.", rowData: (a) => ({ applicationId: a.id, name: a.name, status: a.status }) }),
      open ? applicationDetail(open, keys || [], policies || []) : null,
      h("h2", { id: "application-create-title" }, "Create an application"),
      state.users.length === 0
        ? h("p", {}, "An application needs an owner: create a user first in ", h("a", { href: "#/users" }, "Users & keys"), ".")
        : [form, problemsBox]);
  }

  // --- data protection: what each detector does to the calls a policy applies to --------------

  const DLP_DETECTORS = [["card", "Payment card numbers"], ["iban", "IBANs"], ["email", "Email addresses"],
    ["phone", "Phone numbers"], ["ssn", "US social security numbers"], ["ip", "IP addresses"], ["secret", "Secrets and API keys"],
    ["person", "Names (detection model)"], ["address", "Postal addresses (detection model)"]];
  const DLP_ACTIONS = [["off", "Off"], ["redact", "Redact"], ["pseudonymize", "Pseudonymize"], ["block", "Block"]];
  const DLP_TAKEN = ["block", "pseudonymize", "redact"]; // what a call can take, strongest first
  const dlpActionLabel = (a) => (DLP_ACTIONS.find(([v]) => v === a) || [a, a])[1];
  let editingDlp = null; // the policy whose form is open; null: the create form

  // A request row's findings (logs): the action the call took and the count per detector.
  function dlpCell(r) {
    if (!r.dlp && !r.dlp_action) return null;
    const found = Object.entries(r.dlp || {}).map(([d, n]) => `${d} ×${n}`).join(", ");
    const a = r.dlp_action;
    return h("span", {}, a ? h("span", { class: `badge ${a === "block" ? "bad" : "warn"}` }, a) : "found", found ? ` ${found}` : "");
  }

  // meshfast_dlp_detections_total{detector, action} of a Prometheus text -> detector: {action: count}.
  function dlpDetections(text) {
    const out = new Map();
    for (const line of String(text || "").split("\n")) {
      const m = /^meshfast_dlp_detections_total\{([^}]*)\}\s+(\S+)/.exec(line);
      if (!m) continue;
      const labels = Object.fromEntries([...m[1].matchAll(/(\w+)="((?:[^"\\]|\\.)*)"/g)].map((x) => [x[1], x[2]]));
      const value = Number(m[2]);
      if (!labels.detector || !labels.action || !Number.isFinite(value)) continue;
      const counts = out.get(labels.detector) || {};
      counts[labels.action] = (counts[labels.action] || 0) + value;
      out.set(labels.detector, counts);
    }
    return out;
  }

  // The detections table, read from /admin/metrics (the dashboard's session, like every call).
  async function dlpDetectionsTable() {
    let text;
    try {
      text = (await api("GET", "/admin/metrics", undefined, { accept: "text/plain" })).data;
    } catch (err) {
      if (err.status === 401) throw err;
      return h("p", { class: "error-text", id: "dlp-detections-error" }, `The counters could not be read: ${err.message}`);
    }
    const rows = [...dlpDetections(text)].map(([detector, c]) => ({ detector, ...c, total: DLP_TAKEN.reduce((t, a) => t + (c[a] || 0), 0) }));
    return table("Detections by detector and the action the call took", [
      { key: "detector", label: "Detector", render: (r) => h("code", {}, r.detector) },
      ...DLP_TAKEN.map((a) => ({ key: a, label: dlpActionLabel(a), num: true, render: (r) => num(r[a] || 0) })),
      { key: "total", label: "Total", num: true, render: (r) => num(r.total) },
    ], rows, {
      id: "dlp-detections", empty: "This instance exposes no data protection counters.",
      rowData: (r) => ({ detector: r.detector, block: String(r.block || 0), pseudonymize: String(r.pseudonymize || 0), redact: String(r.redact || 0) }),
    });
  }

  function dlpDetectorsText(p) {
    const order = (d) => DLP_DETECTORS.findIndex(([k]) => k === d);
    const chosen = Object.entries(p.detectors || {}).sort(([a], [b]) => order(a) - order(b));
    const byAction = DLP_TAKEN.map((a) => [a, chosen.filter(([, v]) => v === a).map(([d]) => d)]).filter(([, ds]) => ds.length);
    return byAction.length ? h("ul", {}, byAction.map(([a, ds]) => h("li", {}, `${dlpActionLabel(a)}: ${ds.join(", ")}`))) : "All off";
  }

  const dlpCustomText = (p) => ((p.custom || []).length
    ? h("ul", {}, p.custom.map((c) => h("li", {}, h("code", {}, c.name), " ", h("code", {}, c.pattern), `: ${dlpActionLabel(c.action)}`)))
    : "None");

  function dlpAppliesText(a, apps) {
    const appName = (id) => (apps.find((x) => x.id === id) || { name: id }).name;
    const parts = [];
    const add = (list, what, label = (x) => x) => { if ((list || []).length) parts.push(`${what} ${list.map(label).join(" or ")}`); };
    add(a.models, "model");
    add(a.providers, "provider");
    add(a.business_units, "business unit");
    add(a.tiers, "tier");
    const who = [...(a.users || []).map(userLabel), ...(a.applications || []).map(appName)];
    if (who.length) parts.push(who.join(" or "));
    add(a.leaders, "the organisation of", userLabel);
    return parts.length ? parts.join(" and ") : "Every call";
  }

  // A labelled choice of several; names or ids the policy holds that are not offered any more stay
  // chosen, marked (saving the form must not drop them silently, which could widen the policy).
  function multiPick(label, id, options, chosen, hint) {
    const have = new Set(options.map(([v]) => v));
    const all = [...options, ...(chosen || []).filter((v) => !have.has(v)).map((v) => [v, `${v} (not found)`])];
    return h("div", { class: "field" }, h("label", { for: id }, label),
      h("select", { id, multiple: true, size: Math.min(6, Math.max(2, all.length)), "aria-describedby": `${id}-hint` },
        all.map(([v, l]) => h("option", { value: v, selected: (chosen || []).includes(v) }, l))),
      h("span", { id: `${id}-hint`, class: "muted" }, hint));
  }

  function dlpForm(policies, apps) {
    const p = editingDlp;
    const at = (p && p.applies_to) || {};
    const problemsBox = h("div", { id: "dlp-problems", role: "alert", tabindex: "-1", hidden: true });
    const customBox = h("div", { id: "dlp-custom" });
    const readCustom = () => [...customBox.querySelectorAll("fieldset")].map((_, i) => ({
      name: customBox.querySelector(`#dlp-custom-${i}-name`).value.trim(),
      pattern: customBox.querySelector(`#dlp-custom-${i}-pattern`).value,
      action: customBox.querySelector(`#dlp-custom-${i}-action`).value,
    }));
    const addButton = button("Add a custom pattern", () => {
      const list = [...readCustom(), { name: "", pattern: "", action: "redact" }];
      drawCustom(list);
      customBox.querySelector(`#dlp-custom-${list.length - 1}-name`).focus();
    }, "secondary", { id: "dlp-custom-add" });
    function drawCustom(list) {
      customBox.textContent = "";
      append(customBox, [list.length ? null : h("p", { class: "muted" }, "No custom patterns."),
        list.map((c, i) => h("fieldset", { class: "dlp-custom-row", id: `dlp-custom-${i}` },
          h("legend", {}, `Custom pattern ${i + 1}`),
          field("Detector name", `custom_name_${i}`, { id: `dlp-custom-${i}-name`, value: c.name }),
          field("Pattern", `custom_pattern_${i}`, { id: `dlp-custom-${i}-pattern`, value: c.pattern }),
          field("Action", `custom_action_${i}`, { kind: "select", id: `dlp-custom-${i}-action`, value: c.action, options: DLP_ACTIONS }),
          h("div", { class: "actions" }, button("Remove", () => {
            const rest = readCustom();
            rest.splice(i, 1);
            drawCustom(rest);
            const next = customBox.querySelector(`#dlp-custom-${Math.min(i, rest.length - 1)}-name`);
            (next || addButton).focus();
          }, "secondary", { "aria-label": `Remove custom pattern ${i + 1}` }))))]);
    }
    drawCustom((p && p.custom) || []);

    const pickHint = (what) => `None chosen: any ${what}. Ctrl or Cmd + click chooses several.`;
    const form = h("form", { class: "grid panel", id: "dlp-form", "aria-labelledby": "dlp-form-title" },
      field("Policy name", "name", { required: true, id: "dlp-name", value: p && p.name,
        hint: p ? "A policy keeps its name" : "1 to 64 of A-Z a-z 0-9 . _ -" }),
      field("Enabled", "enabled", { kind: "checkbox", id: "dlp-enabled", value: p ? p.enabled : true }),
      h("fieldset", {}, h("legend", {}, "Built-in detectors"),
        DLP_DETECTORS.map(([k, label]) => field(`${label} (${k})`, `det_${k}`, { kind: "select", id: `dlp-det-${k}`,
          value: (p && p.detectors && p.detectors[k]) || "off", options: DLP_ACTIONS }))),
      h("fieldset", {}, h("legend", {}, "Custom patterns"),
        h("p", { class: "muted" }, "A named regular expression of your own with its action. Names are a-z, 0-9, _ and -; a name another policy uses must have the same pattern. Empty rows are left out."),
        customBox, h("div", { class: "actions" }, addButton)),
      h("fieldset", {}, h("legend", {}, "Applies to"),
        h("p", { class: "muted" }, "The calls that match every list filled in (any one entry of a list; people and applications together are one list). Nothing filled in: every call."),
        multiPick("Models", "dlp-models", state.models.map((m) => [m.name, m.name]), at.models, pickHint("model")),
        multiPick("Providers", "dlp-providers", state.providers.map((x) => [x.name, x.name]), at.providers, pickHint("provider")),
        field("Business units", "business_units", { id: "dlp-bus", value: (at.business_units || []).join(", "), hint: "Comma separated; empty: any unit" }),
        field("Tiers", "tiers", { id: "dlp-tiers", value: (at.tiers || []).join(", "), hint: "Comma separated; empty: any tier" }),
        field("People", "users", { kind: "textarea", rows: 2, id: "dlp-users", value: peopleText(at.users), hint: "Emails, one a line" }),
        multiPick("Applications", "dlp-applications", apps.map((a) => [a.id, a.name]), at.applications, pickHint("application")),
        field("Leaders (their whole organisation)", "leaders", { kind: "textarea", rows: 2, id: "dlp-leaders", value: peopleText(at.leaders), hint: "Emails, one a line" })),
      h("div", { class: "actions" },
        h("button", { type: "submit", id: "dlp-submit" }, p ? "Save policy" : "Create policy"),
        button(p ? "Cancel" : "Clear", () => { editingDlp = null; rerender(); }, "secondary", { id: "dlp-cancel" })));
    if (p) form.querySelector("#dlp-name").readOnly = true;

    form.addEventListener("submit", async (ev) => {
      ev.preventDefault();
      const d = formData(form);
      const picked = (id) => [...form.querySelector(`#${id}`).selectedOptions].map((o) => o.value);
      const detectors = {};
      for (const [k] of DLP_DETECTORS) if (d[`det_${k}`] && d[`det_${k}`] !== "off") detectors[k] = d[`det_${k}`];
      const lists = { models: picked("dlp-models"), providers: picked("dlp-providers"), business_units: labelList(d.business_units),
        tiers: labelList(d.tiers), users: peopleIds(d.users), applications: picked("dlp-applications"), leaders: peopleIds(d.leaders) };
      const applies_to = Object.fromEntries(Object.entries(lists).filter(([, v]) => v.length));
      const body = { enabled: d.enabled, detectors, custom: readCustom().filter((c) => c.name || c.pattern), applies_to };
      const name = p ? p.name : d.name;
      if (!p && policies.some((x) => x.name === name) && !confirmed(`A policy named ${name} exists. Replace it?`)) return;
      let out;
      try {
        out = await api("PUT", `/admin/dlp/policies/${encodeURIComponent(name)}`, body);
      } catch (err) {
        if (err.status === 401) return;
        problemList(problemsBox, problemsOf(err), `The policy was refused (${err.code}):`);
        problemsBox.focus();
        return;
      }
      toast(`Data protection policy ${out.data.name} ${p ? "saved" : "created"}.`);
      editingDlp = null;
      rerender();
    });
    return [form, problemsBox];
  }

  async function renderDlp() {
    const [policies, apps, detections] = await Promise.all([get("/admin/dlp/policies"), get("/admin/applications"),
      dlpDetectionsTable(), loadRegistry()]);
    const list = policies || [];
    if (editingDlp) editingDlp = list.find((x) => x.name === editingDlp.name) || null;
    const put = (p, enabled) => api("PUT", `/admin/dlp/policies/${encodeURIComponent(p.name)}`,
      { enabled, detectors: p.detectors || {}, custom: p.custom || [], applies_to: p.applies_to || {} });
    const rowActions = (p) => h("div", { class: "actions" },
      button("Edit", async () => {
        editingDlp = p;
        await rerender();
        document.getElementById("dlp-enabled").focus();
      }, "secondary", { "aria-label": `Edit policy ${p.name}` }),
      p.enabled
        ? button("Disable", async () => {
          if (!confirmed(`Disable ${p.name}? Its detectors stop applying at once.`)) return;
          if (await act(() => put(p, false), `${p.name} disabled.`)) rerender();
        }, "danger", { "aria-label": `Disable policy ${p.name}` })
        : button("Enable", async () => {
          if (await act(() => put(p, true), `${p.name} enabled.`)) rerender();
        }, "secondary", { "aria-label": `Enable policy ${p.name}` }),
      button("Delete", async () => {
        if (!confirmed(`Delete the data protection policy ${p.name}? Its detectors stop applying at once.`)) return;
        if (await act(() => api("DELETE", `/admin/dlp/policies/${encodeURIComponent(p.name)}`), `${p.name} deleted.`)) rerender();
      }, "danger", { "aria-label": `Delete policy ${p.name}` }));

    const detectionsBox = h("div", { id: "dlp-detections-box" }, detections);
    const readAt = h("span", { class: "muted", id: "dlp-read-at", role: "status" }, `Read at ${new Date().toLocaleTimeString()}.`);
    const refresh = button("Refresh the counts", async () => {
      let fresh;
      try { fresh = await dlpDetectionsTable(); } catch { return; } // 401: already back on the login form
      detectionsBox.textContent = "";
      detectionsBox.append(fresh);
      readAt.textContent = `Read at ${new Date().toLocaleTimeString()}.`;
    }, "secondary", { id: "dlp-refresh" });

    page("Data protection",
      h("p", {}, "Policies scan what callers send before anything is reserved or sent upstream. Each detector can block the call (400 sensitive_content_blocked), pseudonymize the values (surrogates go upstream, the originals come back in the answer), redact them, or stay off. When several enabled policies apply to a call, each detector takes the strongest action among them."),
      h("h2", {}, "Policies"),
      table("Data protection policies", [
        { key: "name", label: "Name" },
        { key: "enabled", label: "State", render: (p) => h("span", { class: `badge ${p.enabled ? "ok" : "bad"}` }, p.enabled ? "enabled" : "disabled") },
        { key: "detectors", label: "Built-in detectors", render: dlpDetectorsText },
        { key: "custom", label: "Custom patterns", render: dlpCustomText },
        { key: "applies_to", label: "Applies to", render: (p) => dlpAppliesText(p.applies_to || {}, apps || []) },
        { key: "version", label: "Version", num: true },
        { key: "updated_at", label: "Updated", render: (p) => when(p.updated_at) },
        { key: "actions", label: "Actions", render: rowActions },
      ], list, { id: "dlp-table", empty: "No policies yet: nothing is scanned.", rowData: (p) => ({ policy: p.name, enabled: String(p.enabled) }) }),
      h("h2", { id: "dlp-form-title" }, editingDlp ? `Edit policy ${editingDlp.name}` : "Create a policy"),
      dlpForm(list, apps || []),
      h("h2", {}, "Detections"),
      h("p", { class: "muted" }, "Sensitive values this instance found since it started, by detector (your own patterns together as custom) and by the action the call took: the counters of /admin/metrics."),
      h("div", { class: "toolbar" }, refresh, readAt),
      detectionsBox);
  }

  // --- people lists: emails shown, user ids sent ---------------------------------------------

  // Emails (or user ids) as typed, one a line or comma separated -> user ids. Anything that names
  // no known user is sent as typed, so the API refuses it by name rather than the list silently
  // losing someone (an empty leaders list would mean everyone).
  function peopleIds(text) {
    const out = [];
    for (const item of String(text || "").split(/[\s,;]+/).map((x) => x.trim()).filter(Boolean)) {
      const u = state.users.find((x) => x.email.toLowerCase() === item.toLowerCase() || x.id === item.toLowerCase());
      const id = u ? u.id : item;
      if (!out.includes(id)) out.push(id);
    }
    return out;
  }
  const peopleText = (ids) => (ids || []).map((id) => userLabel(id)).join("\n");
  const labelList = (text) => [...new Set(String(text || "").split(",").map((x) => x.trim()).filter(Boolean))];
  const pct = (f) => (f === null || f === undefined ? "—" : `${(Number(f) * 100).toFixed(1)}%`);

  // An API error's list of problems (400 invalid_rule / invalid_request carry `errors`), else its message.
  const problemsOf = (err) => (err && err.body && Array.isArray(err.body.errors) && err.body.errors.length
    ? err.body.errors.map(String) : [err.code === "version_conflict"
      ? "version_conflict: someone changed this since you opened it; reload it and apply your change again"
      : err.message]);

  function problemList(box, problems, title) {
    box.textContent = "";
    if (!problems || problems.length === 0) { box.hidden = true; return; }
    box.hidden = false;
    append(box, [h("p", { class: "error-text" }, title), h("ul", {}, problems.map((p) => h("li", {}, p)))]);
  }

  // --- spend rules ---------------------------------------------------------------------------

  const WINDOWS = ["daily", "weekly", "monthly"];
  const RULE_MODES = ["enforce", "shadow", "inherit"];
  const RULE_READ_ONLY = ["version", "created_at", "updated_at", "saved_revision", "enforced_revision", "scheduled",
    "activation_error"];
  const ruleEditor = { text: null, editing: null, notes: "" }; // editing: {id, etag}
  let ruleDryRun = null; // {title, affected}
  let ruleProblems = null; // {title, problems}
  // One dry-run per rule on each render: beyond this many rules, only when asked for.
  const AUTO_UTILIZATION_RULES = 25;
  let utilizationWanted = false;

  const authored = (rule) => Object.fromEntries(Object.entries(rule).filter(([k]) => !RULE_READ_ONLY.includes(k)));
  const scopeText = (scope) => (!scope ? "—" : scope.model !== undefined && scope.model !== null ? `model ${scope.model}` : `tag ${scope.tag}`);

  function populationText(p = {}) {
    const parts = [];
    if ((p.tiers || []).length) parts.push(`tier ${p.tiers.join(" or ")}`);
    if ((p.leaders || []).length) parts.push(`the organisation of ${p.leaders.map(userLabel).join(" or ")}`);
    if ((p.business_units || []).length) parts.push(`business unit ${p.business_units.join(" or ")}`);
    if ((p.applications || []).length) parts.push(`application ${p.applications.join(" or ")}`);
    if ((p.pilots || []).length) parts.push(`pilot ${p.pilots.join(" or ")}`);
    let text = parts.length ? parts.join(" and ") : "everyone";
    if ((p.exempt_users || []).length) text += `, except ${p.exempt_users.map(userLabel).join(", ")}`;
    return text;
  }

  function actionText(a) {
    if (a.type === "pause") return `pause ${a.hours} h`;
    if (a.type === "warn") return `warn “${a.text}”`;
    if (a.type === "notify") return `notify by ${(a.channels || []).join(" and ")}`;
    return a.type;
  }

  function entryText(e) {
    const limits = [];
    if (e.threshold_usd !== null && e.threshold_usd !== undefined) limits.push(`$${e.threshold_usd} ${e.window}`);
    if (e.calls_per_minute) limits.push(`${e.calls_per_minute} calls/min`);
    if (e.tokens_per_minute) limits.push(`${e.tokens_per_minute} tokens/min`);
    const acts = (e.actions || []).map(actionText).join(", ") || "no action";
    return `${limits.join(", ") || "no limit"} on ${scopeText(e.scope)} for ${populationText(e.population)}: ${acts}`;
  }

  // The structured form covers one entry (the common case); the JSON editor holds the whole rule.
  function ruleForm() {
    const modeHint = "Shadow records would-deny without blocking; inherit follows the global switch";
    const scopeNames = [...new Set(state.models.flatMap((m) => [m.name, ...(m.tags || [])]))].sort();
    const form = h("form", { class: "grid", id: "rule-form", "aria-labelledby": "rule-form-title", novalidate: true },
      field("Rule id", "id", { id: "rule-id", required: true, hint: "a-z, 0-9 and -; it does not change later" }),
      field("Weight", "weight", { kind: "number", id: "rule-weight", value: 0, hint: "Higher is evaluated first" }),
      field("Mode", "mode", { kind: "select", id: "rule-mode", value: "shadow", options: RULE_MODES.map((m) => [m, m]), hint: modeHint }),
      h("fieldset", {}, h("legend", {}, "Who"),
        field("Tiers", "tiers", { id: "rule-tiers", hint: "Comma separated; empty: every tier" }),
        field("Business units", "business_units", { id: "rule-bus", hint: "Comma separated; empty: every unit" }),
        field("Pilots", "pilots", { id: "rule-pilots", hint: "Comma separated; empty: anyone, in a pilot or not" }),
        field("Leaders (their whole organisation)", "leaders", { kind: "textarea", id: "rule-leaders", rows: 2 }),
        field("Exempt people", "exempt_users", { kind: "textarea", id: "rule-exempt", rows: 2 }),
        h("p", { class: "muted" }, "People by email, one a line. Lists combine with AND; within a list any one matches.")),
      h("fieldset", {}, h("legend", {}, "What and when"),
        field("Scope", "scope_kind", { kind: "select", id: "rule-scope-kind", value: "tag", options: [["tag", "Registry tag"], ["model", "One model"]] }),
        field("Tag or model name", "scope_value", { id: "rule-scope", list: "rule-scope-names" }),
        h("datalist", { id: "rule-scope-names" }, scopeNames.map((n) => h("option", { value: n }))),
        field("Window", "window", { kind: "select", id: "rule-window", value: "monthly", options: WINDOWS.map((w) => [w, w]), hint: "In the calendar time zone" }),
        field("Threshold (USD)", "threshold_usd", { id: "rule-threshold", inputmode: "decimal" }),
        field("Calls per minute", "calls_per_minute", { kind: "number", min: 1, id: "rule-cpm", hint: "Empty: no cap" }),
        field("Tokens per minute", "tokens_per_minute", { kind: "number", min: 1, id: "rule-tpm", hint: "Empty: no cap" })),
      h("fieldset", {}, h("legend", {}, "Actions at the threshold"),
        field("Block", "act_block", { kind: "checkbox", id: "rule-act-block", value: true }),
        field("Pause", "act_pause", { kind: "checkbox", id: "rule-act-pause" }),
        field("Pause hours", "pause_hours", { kind: "number", min: 1, id: "rule-pause-hours", value: 24 }),
        field("Warn", "act_warn", { kind: "checkbox", id: "rule-act-warn" }),
        field("Warning text", "warn_text", { id: "rule-warn-text", hint: "Sent in X-Meshfast-Warning" }),
        field("Notify", "act_notify", { kind: "checkbox", id: "rule-act-notify" }),
        field("By webhook", "notify_webhook", { kind: "checkbox", id: "rule-notify-webhook", value: true }),
        field("By email", "notify_email", { kind: "checkbox", id: "rule-notify-email" }),
        field("Notification template", "notify_template", { kind: "textarea", id: "rule-template", rows: 2 })));
    return form;
  }

  // The rule the JSON editor holds, or a problem.
  function parseRuleJson(text) {
    try {
      const rule = JSON.parse(text);
      if (!rule || typeof rule !== "object" || Array.isArray(rule)) return { problem: "JSON: the rule must be an object" };
      return { rule };
    } catch (err) {
      return { problem: `JSON: ${err.message}` };
    }
  }

  function entryFromForm(d) {
    const entry = {
      population: { tiers: labelList(d.tiers), leaders: peopleIds(d.leaders), business_units: labelList(d.business_units), exempt_users: peopleIds(d.exempt_users) },
      scope: { [d.scope_kind === "model" ? "model" : "tag"]: d.scope_value },
      window: d.window,
      threshold_usd: d.threshold_usd === "" ? null : d.threshold_usd,
      calls_per_minute: d.calls_per_minute === "" ? null : Number(d.calls_per_minute),
      tokens_per_minute: d.tokens_per_minute === "" ? null : Number(d.tokens_per_minute),
      actions: [],
    };
    if (d.act_block) entry.actions.push({ type: "block" });
    if (d.act_pause) entry.actions.push({ type: "pause", hours: Number(d.pause_hours) });
    if (d.act_warn) entry.actions.push({ type: "warn", text: d.warn_text });
    if (d.act_notify) {
      const action = { type: "notify", channels: [d.notify_webhook ? "webhook" : null, d.notify_email ? "email" : null].filter(Boolean) };
      if (d.notify_template) action.template = d.notify_template;
      entry.actions.push(action);
    }
    return entry;
  }

  // Form -> JSON: the rule's fields and its first entry; other entries in the JSON are kept.
  function formToJson(form, textarea) {
    const d = formData(form);
    const current = parseRuleJson(textarea.value).rule || {};
    const rest = Array.isArray(current.entries) ? current.entries.slice(1) : [];
    const weight = d.weight === "" ? 0 : Number(d.weight);
    const entry = entryFromForm(d);
    // The form has no field for the applications a population holds to: kept as the JSON has them
    // (dropping them would widen the entry to everyone).
    const first = Array.isArray(current.entries) && current.entries[0] && typeof current.entries[0] === "object" ? current.entries[0] : {};
    const apps = first.population && first.population.applications;
    if (apps !== undefined && apps !== null) entry.population.applications = apps;
    // Pilots only when named, so a rule from before pilots keeps its exact shape.
    const pilots = labelList(d.pilots);
    if (pilots.length || (first.population && first.population.pilots !== undefined)) entry.population.pilots = pilots;
    const rule = { ...current, id: d.id, weight: Number.isFinite(weight) ? weight : d.weight, mode: d.mode, entries: [entry, ...rest] };
    textarea.value = JSON.stringify(authored(rule), null, 2);
    ruleEditor.text = textarea.value;
  }

  // JSON -> form: fills the structured fields from the rule and its first entry.
  function jsonToForm(form, textarea, note) {
    const { rule, problem } = parseRuleJson(textarea.value);
    if (problem) return [problem];
    const el = form.elements;
    const set = (name, v) => { el[name].value = v === null || v === undefined ? "" : String(v); };
    set("id", rule.id);
    set("weight", rule.weight ?? 0);
    set("mode", RULE_MODES.includes(rule.mode) ? rule.mode : "inherit");
    const entries = Array.isArray(rule.entries) ? rule.entries : [];
    const e = entries[0] || {};
    const p = e.population || {};
    set("tiers", (p.tiers || []).join(", "));
    set("business_units", (p.business_units || []).join(", "));
    set("pilots", (p.pilots || []).join(", "));
    set("leaders", peopleText(p.leaders));
    set("exempt_users", peopleText(p.exempt_users));
    const scope = e.scope || {};
    const byModel = scope.model !== undefined && scope.model !== null;
    set("scope_kind", byModel ? "model" : "tag");
    set("scope_value", byModel ? scope.model : scope.tag);
    set("window", WINDOWS.includes(e.window) ? e.window : "monthly");
    set("threshold_usd", e.threshold_usd);
    set("calls_per_minute", e.calls_per_minute);
    set("tokens_per_minute", e.tokens_per_minute);
    const action = (type) => (e.actions || []).find((a) => a && a.type === type);
    el.act_block.checked = !!action("block");
    el.act_pause.checked = !!action("pause");
    set("pause_hours", action("pause") ? action("pause").hours : 24);
    el.act_warn.checked = !!action("warn");
    set("warn_text", action("warn") ? action("warn").text : "");
    const notify = action("notify");
    el.act_notify.checked = !!notify;
    el.notify_webhook.checked = notify ? (notify.channels || []).includes("webhook") : true;
    el.notify_email.checked = notify ? (notify.channels || []).includes("email") : false;
    set("notify_template", notify ? notify.template : "");
    el.id.readOnly = !!ruleEditor.editing;
    const notes = [];
    if (entries.length > 1) notes.push(`This rule has ${entries.length} entries: the form shows the first; edit the others in the JSON.`);
    if ((p.applications || []).length) notes.push("Its first entry holds to the applications listed in the JSON (population.applications); edit them there.");
    note.textContent = notes.join(" ");
    return [];
  }

  function dryRunPanel() {
    if (!ruleDryRun) return null;
    const { title, affected } = ruleDryRun;
    return h("section", { class: "panel", id: "dry-run", "aria-labelledby": "dry-run-title" },
      h("h2", { id: "dry-run-title", tabindex: "-1" }, title),
      h("p", { id: "dry-run-count", dataset: { count: String(affected.length) } },
        affected.length ? `${affected.length} at or over a threshold now.` : "No one is at or over a threshold now."),
      button("Hide the dry-run", () => { ruleDryRun = null; rerender(); }, "secondary", { id: "dry-run-hide" }),
      table("People the rule acts on now", [
        { key: "user_id", label: "Person", render: (a) => userLabel(a.user_id) },
        { key: "entry", label: "Entry", num: true, render: (a) => String(a.entry + 1) },
        { key: "action", label: "Action", render: (a) => h("span", { class: `badge ${a.action === "block" || a.action === "pause" ? "bad" : "warn"}` }, a.action) },
        { key: "spend_usd", label: "Spend", num: true, render: (a) => usd(a.spend_usd) },
        { key: "threshold_usd", label: "Threshold", num: true, render: (a) => usd(a.threshold_usd) },
        { key: "utilization", label: "Utilization", num: true, render: (a) => pct(a.utilization) },
      ], affected, { id: "dry-run-table", empty: "No one.", rowData: (a) => ({ userId: a.user_id, action: a.action, utilization: String(a.utilization), entry: String(a.entry) }) }));
  }

  async function showDryRun(title, rule) {
    try {
      const out = await api("POST", "/admin/rules/dry-run", authored(rule));
      ruleDryRun = { title, affected: out.data.affected || [] };
      ruleProblems = null;
    } catch (err) {
      if (err.status === 401) return;
      ruleDryRun = null;
      ruleProblems = { title: `The dry-run was refused (${err.code}):`, problems: problemsOf(err) };
    }
    await rerender();
    const target = document.getElementById(ruleDryRun ? "dry-run-title" : "rule-problems-title");
    if (target) target.focus();
  }

  // Per-rule utilization: the dry-run of each stored rule (people at or over a threshold now).
  async function ruleUtilization(list) {
    const out = new Map();
    let next = 0;
    const worker = async () => {
      while (next < list.length) {
        const rule = list[next++];
        if (!(rule.entries || []).some((e) => e.threshold_usd !== null && e.threshold_usd !== undefined)) { out.set(rule.id, { none: true }); continue; }
        try {
          out.set(rule.id, { affected: (await api("POST", "/admin/rules/dry-run", authored(rule), {}, true)).data.affected || [] });
        } catch (err) {
          out.set(rule.id, { error: err.code });
        }
      }
    };
    await Promise.all([worker(), worker(), worker(), worker()]);
    return out;
  }

  function utilizationCell(u) {
    if (!u) return "—";
    if (u.none) return h("span", { class: "muted" }, "No USD threshold");
    if (u.error) return h("span", { class: "muted" }, `Unavailable (${u.error})`);
    const people = new Set(u.affected.map((a) => a.user_id));
    const max = Math.max(0, ...u.affected.map((a) => Number(a.utilization)));
    return h("span", { dataset: { affected: String(people.size), maxUtilization: String(max) } },
      people.size ? `${people.size} ${people.size === 1 ? "person" : "people"} at or over (highest ${pct(max)})` : "No one at a threshold");
  }

  async function setRuleMode(rule, mode) {
    const out = await act(async () => {
      const current = await api("GET", `/admin/rules/${encodeURIComponent(rule.id)}`);
      return api("PUT", `/admin/rules/${encodeURIComponent(rule.id)}`, { ...authored(current.data), mode }, { "if-match": current.headers.get("etag") });
    }, `Rule ${rule.id} is now in mode ${mode}.`);
    if (out) rerender();
  }

  async function renderRules() {
    await loadRegistry();
    // NOTE: a business unit's administrator may not read or flip the global switch (403).
    const [list, enforcement] = await Promise.all([get("/admin/rules"), getOr("/admin/enforcement", null)]);
    const rulesList = (list || []).slice().sort((a, b) => b.weight - a.weight || a.id.localeCompare(b.id));
    const measured = rulesList.length <= AUTO_UTILIZATION_RULES || utilizationWanted;
    const utilization = measured ? await ruleUtilization(rulesList) : new Map();
    const enforce = enforcement ? !!enforcement.enforce : true;
    const effective = (r) => (r.mode === "inherit" ? (enforce ? "enforce" : "shadow") : r.mode);

    const form = ruleForm();
    const note = h("p", { id: "rule-entries-note", class: "muted", "aria-live": "polite" });
    const textarea = h("textarea", { id: "rule-json", name: "rule_json", rows: 16, spellcheck: "false", class: "mono", "aria-describedby": "rule-json-hint" });
    const problemsBox = h("div", { id: "rule-problems", role: "alert", tabindex: "-1", hidden: true });
    if (ruleProblems) {
      problemList(problemsBox, ruleProblems.problems, ruleProblems.title);
      problemsBox.firstChild.id = "rule-problems-title";
      problemsBox.firstChild.setAttribute("tabindex", "-1");
    }
    if (ruleEditor.text === null) formToJson(form, textarea);
    else { textarea.value = ruleEditor.text; jsonToForm(form, textarea, note); }
    form.elements.id.readOnly = !!ruleEditor.editing;
    for (const ev of ["input", "change"]) form.addEventListener(ev, () => formToJson(form, textarea));
    form.addEventListener("submit", (ev) => ev.preventDefault());
    textarea.addEventListener("input", () => { ruleEditor.text = textarea.value; });

    const editorRule = () => {
      const { rule, problem } = parseRuleJson(textarea.value);
      if (problem) {
        ruleProblems = { title: "The JSON does not parse:", problems: [problem] };
        problemList(problemsBox, ruleProblems.problems, ruleProblems.title);
        problemsBox.focus();
        return null;
      }
      return rule;
    };
    const activation = h("form", { id: "rule-activation", class: "grid", "aria-label": "When the rule takes effect" }, activationFields("rule"));
    activation.addEventListener("submit", (ev) => ev.preventDefault());
    const save = async () => {
      const rule = editorRule();
      if (!rule) return;
      const editing = ruleEditor.editing;
      let out;
      try {
        const body = withActivation(authored(rule), activationOf(activation));
        if (editing) out = await api("PUT", `/admin/rules/${encodeURIComponent(editing.id)}`, body, { "if-match": editing.etag });
        else out = await api("POST", "/admin/rules", body);
      } catch (err) {
        if (err.status === 401) return;
        ruleProblems = { title: `The rule was refused (${err.code}):`, problems: problemsOf(err) };
        problemList(problemsBox, ruleProblems.problems, ruleProblems.title);
        problemsBox.focus();
        return;
      }
      toast(pendingChange(out) ? submittedText(out) : `Rule ${rule.id} ${editing ? "saved" : "created"}.`);
      Object.assign(ruleEditor, { text: null, editing: null });
      ruleProblems = null;
      rerender();
    };

    const editor = h("section", { class: "panel", "aria-labelledby": "rule-form-title", id: "rule-editor" },
      h("h2", { id: "rule-form-title" }, ruleEditor.editing ? `Edit rule ${ruleEditor.editing.id}` : "Author a rule"),
      form, note,
      h("div", { class: "field" }, h("label", { for: "rule-json" }, "Rule as JSON"), textarea,
        h("span", { id: "rule-json-hint", class: "muted" }, "The form writes the first entry here; edit the JSON for several entries, then load it back into the form if you like.")),
      activation,
      h("div", { class: "actions" },
        button("Load the JSON into the form", () => {
          const problems = jsonToForm(form, textarea, note);
          ruleProblems = problems.length ? { title: "The JSON does not parse:", problems } : null;
          problemList(problemsBox, problems, "The JSON does not parse:");
        }, "secondary", { id: "rule-json-to-form" }),
        button("Dry-run", () => { const rule = editorRule(); if (rule) showDryRun(`Dry-run of ${rule.id || "the draft"}`, rule); }, "secondary", { id: "rule-dry-run" }),
        button(ruleEditor.editing ? "Save rule" : "Create rule", save, "", { id: "rule-submit" }),
        button(ruleEditor.editing ? "Cancel" : "Clear", () => { Object.assign(ruleEditor, { text: null, editing: null }); ruleProblems = null; rerender(); }, "secondary", { id: "rule-clear" })),
      problemsBox);

    const modeLabel = { enforce: "Enforce", shadow: "Shadow", inherit: "Inherit" };
    const rowActions = (r) => h("div", { class: "actions" },
      button("Edit", async () => {
        const out = await act(() => api("GET", `/admin/rules/${encodeURIComponent(r.id)}`));
        if (!out) return;
        Object.assign(ruleEditor, { text: JSON.stringify(authored(out.data), null, 2), editing: { id: r.id, etag: out.headers.get("etag") } });
        ruleProblems = null;
        await rerender();
        document.getElementById("rule-weight").focus();
      }, "secondary", { "aria-label": `Edit rule ${r.id}` }),
      button("Dry-run", () => showDryRun(`Dry-run of rule ${r.id}`, r), "secondary", { "aria-label": `Dry-run rule ${r.id}` }),
      RULE_MODES.filter((m) => m !== r.mode).map((m) =>
        button(modeLabel[m], () => setRuleMode(r, m), "secondary", { "aria-label": `Set rule ${r.id} to ${m}` })),
      button("Delete", async () => {
        if (!confirmed(`Delete rule ${r.id}?`)) return;
        if (await act(() => api("DELETE", `/admin/rules/${encodeURIComponent(r.id)}`), `Rule ${r.id} deleted.`)) {
          if (ruleEditor.editing && ruleEditor.editing.id === r.id) Object.assign(ruleEditor, { text: null, editing: null });
          rerender();
        }
      }, "danger", { "aria-label": `Delete rule ${r.id}` }));

    page("Spend rules",
      !enforcement ? null : h("section", { class: "panel", "aria-labelledby": "enforcement-title" },
        h("h2", { id: "enforcement-title" }, "Enforcement (global)"),
        h("p", { id: "enforcement-state", dataset: { enforce: String(enforce) } }, enforce
          ? "Rules in mode inherit enforce: they block, pause, warn and notify."
          : "Rules in mode inherit run in shadow: their would-deny is recorded, nothing is blocked."),
        h("p", { class: "muted" }, "The switch governs rules only; per-user policies always enforce. Rules in mode enforce or shadow keep their own mode."),
        !isUnitAdmin() ? button(enforce ? "Switch rules to shadow mode" : "Enforce rules", async () => {
          if (enforce && !confirmed("Switch every rule in mode inherit to shadow? Nothing they cover will be blocked.")) return;
          if (await act(() => api("PUT", "/admin/enforcement", { enforce: !enforce }), enforce ? "Rules are in shadow mode." : "Rules enforce.")) rerender();
        }, enforce ? "danger" : "", { id: "enforcement-toggle" }) : null),
      h("h2", {}, "Rules"),
      h("p", { class: "muted" }, "Utilization: the people at or over a threshold of the rule now, from a dry-run of the stored rule against the current counters."),
      measured ? null : button(`Compute the utilization of all ${rulesList.length} rules`, () => { utilizationWanted = true; rerender(); }, "secondary", { id: "rules-utilization" }),
      table("Spend rules, highest weight first", [
        { key: "id", label: "Rule", render: (r) => h("code", {}, r.id) },
        { key: "mode", label: "Mode", render: (r) => h("span", {}, h("span", { class: `badge ${effective(r) === "enforce" ? "ok" : "warn"}` }, r.mode),
          r.mode === "inherit" ? ` (${effective(r)})` : "") },
        { key: "weight", label: "Weight", num: true },
        { key: "entries", label: "Entries", render: (r) => h("ol", {}, (r.entries || []).map((e) => h("li", {}, entryText(e)))) },
        { key: "utilization", label: "Utilization", render: (r) => utilizationCell(utilization.get(r.id)) },
        { key: "version", label: "Version", num: true },
        { key: "revision", label: "Enforced", render: revisionCell },
        { key: "updated_at", label: "Updated", render: (r) => when(r.updated_at) },
        { key: "actions", label: "Actions", render: rowActions },
      ], rulesList, { id: "rules-table", empty: "No rules yet.", rowData: (r) => ({ ruleId: r.id, mode: r.mode, effectiveMode: effective(r), version: String(r.version) }) }),
      dryRunPanel(),
      editor);
  }

  // --- notifications ---------------------------------------------------------------------------

  const deliveriesQuery = { status: "", channel: "", action: "", rule_id: "", page: 1, page_size: 25 };

  async function renderNotifications() {
    await loadRegistry();
    const params = new URLSearchParams({ page: deliveriesQuery.page, page_size: deliveriesQuery.page_size });
    for (const k of ["status", "channel", "action", "rule_id"]) if (deliveriesQuery[k]) params.set(k, deliveriesQuery[k]);
    const [settings, out] = await Promise.all([get("/admin/notifications"), get(`/admin/notifications/deliveries?${params}`)]);
    const smtp = settings.smtp || {};
    const problemsBox = h("div", { id: "notifications-problems", role: "alert", tabindex: "-1", hidden: true });
    const form = h("form", { class: "grid panel", id: "notifications-form", "aria-labelledby": "channels-title", novalidate: true },
      h("fieldset", {}, h("legend", {}, "Webhook"),
        field("Webhook URL", "webhook_url", { kind: "url", id: "webhook-url", value: settings.webhook_url, hint: "Empty: no webhook" }),
        field("Webhook secret", "webhook_secret", { kind: "password", id: "webhook-secret", autocomplete: "new-password",
          hint: settings.webhook_secret_set ? "A secret is set; leave empty to keep it" : "Signs each delivery (X-Meshfast-Signature); required with a URL" }),
        field("Local (allow loopback and private addresses)", "webhook_local", { kind: "checkbox", id: "webhook-local", value: settings.webhook_local })),
      h("fieldset", {}, h("legend", {}, "Email (SMTP)"),
        field("SMTP host", "smtp_host", { id: "smtp-host", value: smtp.host, hint: "Empty: no email" }),
        field("SMTP port", "smtp_port", { kind: "number", min: 1, id: "smtp-port", value: smtp.port ?? 587 }),
        field("From address", "smtp_from", { kind: "email", id: "smtp-from", value: smtp.from }),
        field("SMTP username", "smtp_username", { id: "smtp-username", value: smtp.username }),
        field("SMTP password", "smtp_password", { kind: "password", id: "smtp-password", autocomplete: "new-password",
          hint: smtp.password_set ? "A password is set; leave empty to keep it" : "Empty: none" }),
        field("STARTTLS", "smtp_starttls", { kind: "checkbox", id: "smtp-starttls", value: smtp.starttls })),
      h("div", { class: "actions" }, h("button", { type: "submit", id: "notifications-submit" }, "Save channels")));
    form.addEventListener("submit", async (ev) => {
      ev.preventDefault();
      const d = formData(form);
      const body = { webhook_local: d.webhook_local };
      if (d.webhook_url) {
        body.webhook_url = d.webhook_url;
        if (d.webhook_secret) body.webhook_secret = d.webhook_secret;
      } else {
        Object.assign(body, { webhook_url: null, webhook_secret: null });
      }
      if (d.smtp_host) {
        body.smtp = { host: d.smtp_host, port: Number(d.smtp_port), from: d.smtp_from, username: d.smtp_username || null, starttls: d.smtp_starttls };
        if (d.smtp_password) body.smtp.password = d.smtp_password;
      } else if (settings.smtp) {
        body.smtp = null;
      }
      try {
        await api("PUT", "/admin/notifications", body);
      } catch (err) {
        if (err.status === 401) return;
        problemList(problemsBox, problemsOf(err), `The channels were refused (${err.code}):`);
        problemsBox.focus();
        return;
      }
      toast("Notification channels saved.");
      rerender();
    });

    const filters = h("form", { class: "grid panel", id: "deliveries-filters", "aria-label": "Delivery filters" },
      field("Status", "status", { kind: "select", value: deliveriesQuery.status, options: [["", "Any"], ["pending", "Pending"], ["delivered", "Delivered"], ["failed", "Failed"], ["skipped", "Skipped"]] }),
      field("Channel", "channel", { kind: "select", value: deliveriesQuery.channel, options: [["", "Any"], ["webhook", "Webhook"], ["email", "Email"]] }),
      field("Kind", "action", { kind: "select", value: deliveriesQuery.action, options: [["", "Any"], ["notify", "Notification"], ["digest", "Leadership digest"]] }),
      field("Rule id", "rule_id", { id: "deliveries-rule", value: deliveriesQuery.rule_id }),
      h("div", { class: "actions" }, h("button", { type: "submit", id: "deliveries-apply" }, "Apply filters")));
    filters.addEventListener("submit", (ev) => { ev.preventDefault(); Object.assign(deliveriesQuery, formData(filters), { page: 1 }); rerender(); });
    const pages = Math.max(1, Math.ceil(out.total / out.page_size));
    const statusBadge = (r) => h("span", { class: `badge ${r.status === "delivered" ? "ok" : r.status === "failed" ? "bad" : "warn"}` }, r.status);
    page("Notifications",
      h("h2", { id: "channels-title" }, "Channels"),
      h("p", { class: "muted" }, "Where a rule's notify action and the leadership digests go. Secrets are stored sealed and never shown again."),
      form, problemsBox,
      h("h2", {}, "Deliveries"),
      filters,
      h("p", { id: "deliveries-total", dataset: { total: String(out.total) } }, `${num(out.total)} deliveries.`),
      table("Deliveries, newest first", [
        { key: "created_at", label: "Time", render: (r) => when(r.created_at) },
        { key: "rule_id", label: "Rule", render: (r) => h("code", {}, r.rule_id) },
        { key: "user_id", label: "Person", render: (r) => userLabel(r.user_id) },
        { key: "action", label: "Kind" },
        { key: "channel", label: "Channel" },
        { key: "window", label: "Window", render: (r) => `${r.window} from ${when(r.window_start)}` },
        { key: "threshold_usd", label: "Threshold", num: true, render: (r) => usd(r.threshold_usd) },
        { key: "spend_usd", label: "Spend", num: true, render: (r) => usd(r.spend_usd) },
        { key: "status", label: "Status", render: statusBadge },
        { key: "attempts", label: "Attempts", num: true },
        { key: "last_error", label: "Last error" },
        { key: "delivered_at", label: "Delivered", render: (r) => when(r.delivered_at) },
      ], out.deliveries, { id: "deliveries-table", empty: "No deliveries match.", rowData: (r) => ({ deliveryId: r.delivery_id, ruleId: r.rule_id, status: r.status }) }),
      h("nav", { class: "pager", "aria-label": "Delivery pages" },
        button("Previous page", () => { deliveriesQuery.page -= 1; rerender(); }, "secondary", { disabled: out.page <= 1 }),
        h("span", {}, `Page ${out.page} of ${pages}`),
        button("Next page", () => { deliveriesQuery.page += 1; rerender(); }, "secondary", { disabled: out.page >= pages })));
  }

  // --- governed lifecycle: saved and enforced revisions, activation ---------------------------

  // A control's revisions as reads show them: live (what is saved is enforced), scheduled for a
  // time, or its activation failed.
  function revisionState(c) {
    if (!c || ((c.saved_revision ?? null) === null && (c.enforced_revision ?? null) === null && !c.scheduled && !c.activation_error)) return null;
    // activation_error: {revision, error} (or its text); scheduled: {revision, activate_at} (or the time).
    const failed = c.activation_error && typeof c.activation_error === "object" ? c.activation_error.error : c.activation_error;
    if (failed) return { state: "failed", text: `activation failed: ${failed}` };
    const at = c.scheduled && typeof c.scheduled === "object" ? c.scheduled.activate_at || c.scheduled.at : c.scheduled;
    if (at) return { state: "scheduled", text: `scheduled for ${when(at)}` };
    if (c.saved_revision !== c.enforced_revision) return { state: "pending", text: "saved, not enforced yet" };
    return { state: "live", text: "live" };
  }

  function revisionCell(c) {
    const r = revisionState(c);
    if (!r) return "—";
    const cls = r.state === "live" ? "ok" : r.state === "failed" ? "bad" : "warn";
    return h("span", { dataset: { revisionState: r.state, saved: String(c.saved_revision ?? ""), enforced: String(c.enforced_revision ?? "") } },
      h("span", { class: `badge ${cls}` }, r.text), " ",
      h("span", { class: "muted" }, `saved ${c.saved_revision ?? "—"}, enforced ${c.enforced_revision ?? "none"}`));
  }

  // When a saved control takes effect: at once, at the business unit's local midnight, or at a time.
  function activationFields(prefix) {
    const when_ = field("Takes effect", "activate_kind", { kind: "select", id: `${prefix}-activate-kind`, value: "now",
      options: [["now", "At once (or on approval)"], ["local-midnight", "At the business unit's next local midnight"], ["at", "At a set time"]] });
    const at = field("Activation time", "activate_at", { kind: "datetime-local", id: `${prefix}-activate-at`, hint: "Your browser's time zone" });
    return h("fieldset", { class: "activation" }, h("legend", {}, "Activation"), when_, at);
  }
  function activationOf(form) {
    const kind = form.elements.activate_kind ? form.elements.activate_kind.value : "now";
    if (kind === "local-midnight") return "local-midnight";
    if (kind === "at" && form.elements.activate_at.value) return isoFromLocal(form.elements.activate_at.value);
    return undefined;
  }

  // A control body's activate_at, when one was chosen.
  const withActivation = (body, activateAt) => (activateAt ? { ...body, activate_at: activateAt } : body);

  // --- approvals: changes business unit administrators submitted -------------------------------

  const changesQuery = { status: "pending", page: 1, page_size: 25 };
  let openChange = null; // a change id

  const CHANGE_STATUSES = [["pending", "Pending"], ["approved", "Approved (scheduled)"], ["applied", "Applied"],
    ["rejected", "Rejected"], ["failed", "Failed"], ["expired", "Expired"], ["superseded", "Superseded"], ["", "Any"]];
  const changeBadge = (status) => h("span", { class: `badge ${["pending", "approved", "superseded", "expired"].includes(status) ? "warn" : status === "rejected" || status === "failed" ? "bad" : "ok"}` }, status);
  const activationText = (c) => (!c.activate_at ? "On approval"
    : c.activate_at === "local-midnight" ? "At the business unit's next local midnight" : when(c.activate_at));
  const changeTarget = (c) => c.target_name || c.target || c.target_id || "—";

  // Every leaf of a JSON value under its dotted path: {"a": {"b": [1]}} -> a.b.0 = 1.
  function flatten(value, prefix = "", out = new Map()) {
    if (value !== null && typeof value === "object" && !(Array.isArray(value) && value.length === 0) && Object.keys(value).length) {
      for (const [k, v] of Object.entries(value)) flatten(v, prefix ? `${prefix}.${k}` : k, out);
    } else if (prefix) {
      out.set(prefix, value);
    }
    return out;
  }
  const leafText = (v) => (v === undefined ? "(absent)" : JSON.stringify(v));

  // Field by field: every path in either, the current value beside the proposed one.
  function fieldDiff(current, proposed) {
    const a = flatten(current || {});
    const b = flatten(proposed || {});
    const keys = [...new Set([...b.keys(), ...a.keys()])];
    return keys.map((k) => ({ field: k, current: a.get(k), proposed: b.get(k), changed: leafText(a.get(k)) !== leafText(b.get(k)) }));
  }

  // A line diff of two texts (longest common subsequence): [{op: " " | "-" | "+", line}].
  function lineDiff(before, after) {
    const a = before.split("\n");
    const b = after.split("\n");
    const n = a.length, m = b.length;
    const lcs = Array.from({ length: n + 1 }, () => new Array(m + 1).fill(0));
    for (let i = n - 1; i >= 0; i--) for (let j = m - 1; j >= 0; j--) lcs[i][j] = a[i] === b[j] ? lcs[i + 1][j + 1] + 1 : Math.max(lcs[i + 1][j], lcs[i][j + 1]);
    const out = [];
    let i = 0, j = 0;
    while (i < n && j < m) {
      if (a[i] === b[j]) { out.push({ op: " ", line: a[i] }); i++; j++; }
      else if (lcs[i + 1][j] >= lcs[i][j + 1]) out.push({ op: "-", line: a[i++] });
      else out.push({ op: "+", line: b[j++] });
    }
    while (i < n) out.push({ op: "-", line: a[i++] });
    while (j < m) out.push({ op: "+", line: b[j++] });
    return out;
  }

  // Read-only fields of a stored control that a proposal does not carry.
  const CONTROL_META = ["version", "created_at", "updated_at", "saved_revision", "enforced_revision", "scheduled", "activation_error", "activate_at"];
  const stripMeta = (c) => (c && typeof c === "object" && !Array.isArray(c) ? Object.fromEntries(Object.entries(c).filter(([k]) => !CONTROL_META.includes(k))) : c);

  // What the change would replace: the server's copy when the change carries it, else the control
  // read now from its own route.
  async function currentOf(c) {
    if (c.current !== undefined) return c.current;
    if (c.before !== undefined) return c.before;
    const kind = String(c.kind || "");
    const target = c.target_id || c.target;
    if (c.action === "create" || !target) return null;
    try {
      // A person's policy on a model: <user id>:<model id>.
      if (kind === "policy") {
        const [userId, modelId] = String(target).split(":");
        const policies = (await api("GET", `/admin/users/${encodeURIComponent(userId)}/policies`, undefined, {}, true)).data || [];
        const p = policies.find((x) => x.model_id === modelId);
        return p ? Object.fromEntries(Object.entries(p).filter(([k]) => !["model_id", "model_name", "user_id"].includes(k))) : null;
      }
      if (kind === "restrictions") return (await api("GET", `/admin/models/${encodeURIComponent(target)}`, undefined, {}, true)).data.restrictions ?? null;
      const path = kind === "rule" ? `/admin/rules/${encodeURIComponent(target)}` : kind === "pilot" ? `/admin/pilots/${encodeURIComponent(target)}` : null;
      return path ? (await api("GET", path, undefined, {}, true)).data : null;
    } catch {
      return null;
    }
  }

  function diffView(c, current) {
    const proposed = stripMeta(c.body !== undefined ? c.body : c.proposed);
    const base = stripMeta(current);
    const rows = fieldDiff(base, proposed);
    const changedCount = rows.filter((r) => r.changed).length;
    const parts = [
      h("p", { id: "change-diff-summary", dataset: { changed: String(changedCount) } },
        current === null || current === undefined ? "A new control: every field is proposed." : `${changedCount} field${changedCount === 1 ? "" : "s"} would change.`),
      table("Proposed control against the current one, field by field", [
        { key: "field", label: "Field", render: (r) => h("code", {}, r.field) },
        { key: "current", label: "Current", render: (r) => h("code", {}, leafText(r.current)) },
        { key: "proposed", label: "Proposed", render: (r) => h("code", {}, leafText(r.proposed)) },
        { key: "changed", label: "Change", render: (r) => (r.changed ? h("span", { class: "badge warn" }, "changed") : h("span", { class: "muted" }, "same")) },
      ], rows, { id: "change-diff", empty: "The proposal is empty.", rowData: (r) => ({ field: r.field, changed: String(r.changed) }) }),
    ];
    if (String(c.kind) === "rule" || (proposed && Array.isArray(proposed.entries))) {
      const lines = lineDiff(base ? JSON.stringify(base, null, 2) : "", JSON.stringify(proposed, null, 2));
      parts.push(h("figure", { class: "line-diff" }, h("figcaption", {}, "The rule as JSON, line by line (− current, + proposed)"),
        h("pre", { id: "change-line-diff", tabindex: "0", "aria-label": "Line diff of the rule's JSON" },
          lines.map((l) => h("span", { class: l.op === "+" ? "add" : l.op === "-" ? "del" : "same", dataset: { op: l.op } },
            `${l.op === " " ? " " : l.op === "-" ? "−" : "+"} ${l.line}\n`)))));
    }
    return parts;
  }

  async function changeDetail(id) {
    const out = await api("GET", `/admin/changes/${encodeURIComponent(id)}`);
    const c = out.data;
    const digest = out.headers.get("etag") || (c.digest ? `"${c.digest}"` : null);
    const current = await currentOf(c);
    const problems = h("div", { id: "change-problems", role: "alert", tabindex: "-1", hidden: true });
    const mine = state.me && [c.requested_by, c.requested_by_email].includes(state.me.email);
    const close = () => {
      openChange = null;
      if (location.hash !== "#/approvals") location.hash = "#/approvals";
      else rerender();
    };
    const refused = (err, what) => {
      const text = err.code === "self_approval"
        ? "You requested this change yourself: another platform administrator must review it (self-approval is refused)."
        : err.code === "comment_required" ? "A comment is required to reject a change (the server refused an empty one)."
          : err.code === "change_expired" ? "The change expired before anyone decided it; its requester must submit it again."
            : err.code === "change_not_pending" ? "Someone decided this change already; reload it."
              : err.status === 409 || err.status === 412
                ? "The change or its control moved on since you opened it; reload it and review it again." : null;
      problemList(problems, text ? [text, `Server answer: ${err.message}`] : problemsOf(err), `The ${what} was refused (${err.code}):`);
      problems.focus();
    };
    let actions;
    if (!isPlatform()) {
      actions = h("p", { id: "change-read-only", class: "muted" }, "Read-only: a platform administrator approves or rejects this change.");
    } else if (c.status !== "pending") {
      actions = h("p", { id: "change-decided", class: "muted" }, `This change is ${c.status}; there is nothing to decide.`);
    } else {
      const comment = h("textarea", { id: "reject-comment", name: "comment", rows: 3, "aria-describedby": "reject-comment-hint" });
      const rejectForm = h("form", { id: "reject-form", class: "panel", "aria-labelledby": "reject-title", novalidate: true },
        h("h3", { id: "reject-title" }, "Reject"),
        h("div", { class: "field" }, h("label", { for: "reject-comment" }, "Rejection comment (required)"), comment,
          h("span", { id: "reject-comment-hint", class: "muted" }, "Tells the requester why; a rejection needs one.")),
        h("div", { class: "actions" }, h("button", { type: "submit", class: "danger", id: "change-reject" }, "Reject change")));
      rejectForm.addEventListener("submit", async (ev) => {
        ev.preventDefault();
        if (comment.value === "") {
          problemList(problems, ["Write a comment before rejecting: the requester sees it."], "The rejection needs a comment:");
          comment.setAttribute("aria-invalid", "true");
          problems.focus();
          return;
        }
        comment.removeAttribute("aria-invalid");
        try {
          await api("POST", `/admin/changes/${encodeURIComponent(id)}/reject`, { comment: comment.value });
        } catch (err) {
          if (err.status !== 401) refused(err, "rejection");
          return;
        }
        toast(`Change ${id} rejected.`);
        rerender();
      });
      actions = [
        mine ? h("p", { class: "error-text", id: "change-own" }, "You requested this change: the server refuses self-approval; another platform administrator must approve it.") : null,
        h("div", { class: "actions" }, button("Approve change", async () => {
          try {
            await api("POST", `/admin/changes/${encodeURIComponent(id)}/approve`, undefined, digest ? { "if-match": digest } : {});
          } catch (err) {
            if (err.status !== 401) refused(err, "approval");
            return;
          }
          toast(`Change ${id} approved.`);
          rerender();
        }, "", { id: "change-approve" })),
        rejectForm,
      ];
    }
    const facts = [
      ["Status", changeBadge(c.status)], ["Kind", c.kind], ["Action", c.action], ["Target", changeTarget(c)],
      ["Business unit", c.business_unit || "—"], ["Requested by", c.requested_by_email || c.requested_by || "—"],
      ["Requested", when(c.created_at || c.requested_at)], ["Takes effect", activationText(c)],
      c.decided_by ? ["Decided by", c.decided_by] : null, c.comment ? ["Comment", c.comment] : null,
      c.activation_error ? ["Activation error", h("span", { class: "error-text" }, typeof c.activation_error === "object" ? c.activation_error.error : c.activation_error)] : null,
      c.digest ? ["Digest", h("code", {}, c.digest)] : null,
    ].filter(Boolean);
    return h("section", { class: "panel", id: "change-detail", "aria-labelledby": "change-title", dataset: { changeId: c.id || id, status: c.status } },
      h("h2", { id: "change-title", tabindex: "-1" }, `Change ${c.id || id}`),
      h("dl", { class: "facts", id: "change-facts" }, facts.map(([k, v]) => h("div", { dataset: { fact: k } }, h("dt", {}, k), h("dd", {}, v)))),
      h("h3", {}, "What would change"),
      diffView(c, current),
      actions, problems,
      h("div", { class: "actions" }, button("Back to the queue", close, "secondary", { id: "change-close" })));
  }

  async function renderApprovals() {
    const wanted = new URLSearchParams(location.hash.split("?")[1] || "").get("change");
    if (wanted) openChange = wanted;
    const params = new URLSearchParams({ page: changesQuery.page, page_size: changesQuery.page_size });
    if (changesQuery.status) params.set("status", changesQuery.status);
    const out = await get(`/admin/changes?${params}`);
    const list = (Array.isArray(out) ? out : out.changes || out.items || []).slice();
    const total = Array.isArray(out) ? list.length : out.total ?? list.length;
    const pageSize = (out && out.page_size) || changesQuery.page_size;
    const pageNo = (out && out.page) || changesQuery.page;
    // Pending first, then newest first.
    const at = (c) => Date.parse(c.created_at || c.requested_at || 0) || 0;
    list.sort((a, b) => (a.status === "pending" ? 0 : 1) - (b.status === "pending" ? 0 : 1) || at(b) - at(a));
    const pages = Math.max(1, Math.ceil(total / pageSize));
    const filters = h("form", { class: "toolbar", id: "changes-filters", "aria-label": "Change filters" },
      field("Status", "status", { kind: "select", id: "changes-status", value: changesQuery.status, options: CHANGE_STATUSES }),
      h("button", { type: "submit", id: "changes-apply" }, "Apply filter"));
    filters.addEventListener("submit", (ev) => { ev.preventDefault(); Object.assign(changesQuery, { status: filters.elements.status.value, page: 1 }); rerender(); });
    const detail = openChange ? await changeDetail(openChange) : null;
    page("Approvals",
      h("p", {}, isPlatform()
        ? "Changes business unit administrators made that raise or relax a control wait here; approving applies exactly the change reviewed, at its activation time."
        : "Changes to your units' controls that wait for a platform administrator; you see them read-only."),
      detail,
      h("h2", {}, "Queue"),
      filters,
      h("p", { id: "changes-total", dataset: { total: String(total) } }, `${num(total)} change${total === 1 ? "" : "s"}.`),
      table("Changes, pending first", [
        { key: "created_at", label: "Requested", render: (c) => when(c.created_at || c.requested_at) },
        { key: "kind", label: "Kind" }, { key: "action", label: "Action" },
        { key: "target", label: "Target", render: (c) => h("code", {}, changeTarget(c)) },
        { key: "business_unit", label: "Business unit" },
        { key: "requested_by", label: "Requested by", render: (c) => c.requested_by_email || c.requested_by || "—" },
        { key: "activate_at", label: "Takes effect", render: activationText },
        { key: "status", label: "Status", render: (c) => changeBadge(c.status) },
        { key: "actions", label: "Actions", render: (c) => button(isPlatform() && c.status === "pending" ? "Review" : "View", async () => {
          openChange = c.id;
          await rerender();
          document.getElementById("change-title").focus();
        }, "secondary", { "aria-label": `${isPlatform() && c.status === "pending" ? "Review" : "View"} change ${c.id}` }) },
      ], list, { id: "changes-table", empty: "No change matches.", rowData: (c) => ({ changeId: c.id, status: c.status, kind: c.kind }) }),
      h("nav", { class: "pager", "aria-label": "Change pages" },
        button("Previous page", () => { changesQuery.page -= 1; rerender(); }, "secondary", { disabled: pageNo <= 1 }),
        h("span", {}, `Page ${pageNo} of ${pages}`),
        button("Next page", () => { changesQuery.page += 1; rerender(); }, "secondary", { disabled: pageNo >= pages })));
  }

  // --- pilots: cohorts of people trying models, usable in rules as population.pilots ----------

  let editingPilot = null; // {entity, etag}
  const PILOT_MODES = ["enforce", "shadow", "inherit"];

  function pilotTierRow(t, i) {
    return h("fieldset", { class: "tier-row", id: `pilot-tier-${i}` }, h("legend", {}, `Tier ${i + 1}`),
      field("Tier name", `tier_name_${i}`, { id: `pilot-tier-${i}-name`, value: t.name }),
      field("Amount (USD)", `tier_amount_${i}`, { id: `pilot-tier-${i}-amount`, inputmode: "decimal", value: t.amount_usd }),
      field("Window", `tier_window_${i}`, { kind: "select", id: `pilot-tier-${i}-window`, value: t.window || "monthly", options: WINDOWS.map((w) => [w, w]) }),
      field("Exceptions", `tier_exceptions_${i}`, { kind: "textarea", rows: 2, id: `pilot-tier-${i}-exceptions`, value: peopleText(t.exceptions), hint: "People by email, one a line" }));
  }

  function pilotForm() {
    const p = editingPilot ? editingPilot.entity : null;
    const problemsBox = h("div", { id: "pilot-problems", role: "alert", tabindex: "-1", hidden: true });
    const tiersBox = h("div", { id: "pilot-tiers" });
    const readTiers = () => [...tiersBox.querySelectorAll("fieldset.tier-row")].map((_, i) => ({
      name: tiersBox.querySelector(`#pilot-tier-${i}-name`).value.trim(),
      amount_usd: tiersBox.querySelector(`#pilot-tier-${i}-amount`).value.trim(),
      window: tiersBox.querySelector(`#pilot-tier-${i}-window`).value,
      exceptions: peopleIds(tiersBox.querySelector(`#pilot-tier-${i}-exceptions`).value),
    }));
    const drawTiers = (list) => {
      tiersBox.textContent = "";
      append(tiersBox, [list.length ? null : h("p", { class: "muted" }, "No tiers: the pilot's members follow their own rules."),
        list.map((t, i) => [pilotTierRow(t, i), h("div", { class: "actions" }, button("Remove", () => {
          const rest = readTiers();
          rest.splice(i, 1);
          drawTiers(rest);
          addTier.focus();
        }, "secondary", { "aria-label": `Remove tier ${i + 1}` }))])]);
    };
    const addTier = button("Add a tier", () => {
      const list = [...readTiers(), { name: "", amount_usd: "", window: "monthly", exceptions: [] }];
      drawTiers(list);
      tiersBox.querySelector(`#pilot-tier-${list.length - 1}-name`).focus();
    }, "secondary", { id: "pilot-tier-add" });
    drawTiers((p && p.tiers) || []);
    const expires = p && p.expires_at ? localInput(new Date(p.expires_at)) : "";
    const form = h("form", { class: "grid panel", id: "pilot-form", "aria-labelledby": "pilot-form-title", novalidate: true },
      field("Pilot name", "name", { id: "pilot-name", required: true, value: p && p.name }),
      field("Mode", "mode", { kind: "select", id: "pilot-mode", value: p ? p.mode : "shadow", options: PILOT_MODES.map((m) => [m, m]),
        hint: "Shadow records would-deny; inherit follows the global switch" }),
      field("Expires", "expires_at", { kind: "datetime-local", id: "pilot-expires", value: expires, hint: "Your browser's time zone" }),
      field("Authoritative (its tiers replace the members' other rules)", "authoritative", { kind: "checkbox", id: "pilot-authoritative", value: p && p.authoritative }),
      field("Members", "members", { kind: "textarea", rows: 3, id: "pilot-members", value: peopleText(p && p.members), hint: "People by email, one a line" }),
      multiPick("Models", "pilot-models", state.models.map((m) => [m.name, m.name]), p && p.models, "The models the pilot tries. Ctrl or Cmd + click chooses several."),
      h("fieldset", { class: "wide" }, h("legend", {}, "Tiers"), tiersBox, h("div", { class: "actions" }, addTier)),
      // NOTE: offered once pilots are under the lifecycle (their reads then carry revisions).
      activationFields("pilot"),
      h("div", { class: "actions" },
        h("button", { type: "submit", id: "pilot-submit" }, p ? "Save pilot" : "Create pilot"),
        button(p ? "Cancel" : "Clear", () => { editingPilot = null; rerender(); }, "secondary", { id: "pilot-cancel" })));
    form.addEventListener("submit", async (ev) => {
      ev.preventDefault();
      const d = formData(form);
      const body = {
        name: d.name, members: peopleIds(d.members), models: [...form.querySelector("#pilot-models").selectedOptions].map((o) => o.value),
        authoritative: d.authoritative, mode: d.mode, expires_at: d.expires_at ? isoFromLocal(d.expires_at) : null,
        tiers: readTiers().filter((t) => t.name || t.amount_usd),
      };
      let out;
      try {
        const payload = withActivation(body, activationOf(form));
        out = p ? await api("PUT", `/admin/pilots/${encodeURIComponent(p.id)}`, payload, editingPilot.etag ? { "if-match": editingPilot.etag } : {})
          : await api("POST", "/admin/pilots", payload);
      } catch (err) {
        if (err.status === 401) return;
        problemList(problemsBox, problemsOf(err), `The pilot was refused (${err.code}):`);
        problemsBox.focus();
        return;
      }
      toast(pendingChange(out) ? submittedText(out) : `Pilot ${d.name} ${p ? "saved" : "created"}.`);
      editingPilot = null;
      rerender();
    });
    return [form, problemsBox];
  }

  async function renderPilots() {
    const [out] = await Promise.all([get("/admin/pilots"), loadRegistry()]);
    const list = Array.isArray(out) ? out : (out && (out.pilots || out.items)) || [];
    const tiersText = (p) => ((p.tiers || []).length
      ? h("ul", {}, p.tiers.map((t) => h("li", {}, `${t.name}: $${t.amount_usd} ${t.window}${(t.exceptions || []).length ? ` (except ${t.exceptions.map(userLabel).join(", ")})` : ""}`)))
      : "None");
    const rowActions = (p) => h("div", { class: "actions" },
      button("Edit", async () => {
        const got = await act(() => api("GET", `/admin/pilots/${encodeURIComponent(p.id)}`));
        if (!got) return;
        editingPilot = { entity: got.data, etag: got.headers.get("etag") };
        await rerender();
        document.getElementById("pilot-name").focus();
      }, "secondary", { "aria-label": `Edit pilot ${p.name}` }),
      button("Delete", async () => {
        if (!confirmed(`Delete pilot ${p.name}? Rules naming it stop matching its members.`)) return;
        if (await act(() => api("DELETE", `/admin/pilots/${encodeURIComponent(p.id)}`), `Pilot ${p.name} deleted.`)) {
          if (editingPilot && editingPilot.entity.id === p.id) editingPilot = null;
          rerender();
        }
      }, "danger", { "aria-label": `Delete pilot ${p.name}` }));
    page("Pilots",
      h("p", {}, "A pilot is a cohort of people trying models under its own terms until it expires; rules name it in population.pilots."),
      table("Pilots", [
        { key: "name", label: "Name" },
        { key: "members", label: "Members", render: (p) => (p.members || []).map(userLabel).join(", ") || "No one" },
        { key: "models", label: "Models", render: (p) => (p.models || []).join(", ") || "—" },
        { key: "mode", label: "Mode", render: (p) => h("span", { class: `badge ${p.mode === "enforce" ? "ok" : "warn"}` }, p.mode) },
        { key: "authoritative", label: "Authoritative", render: (p) => (p.authoritative ? "yes" : "no") },
        { key: "expires_at", label: "Expires", render: (p) => (p.live === false
          ? h("span", {}, h("span", { class: "badge bad" }, "expired"), ` ${when(p.expires_at)}`) : when(p.expires_at)) },
        { key: "tiers", label: "Tiers", render: tiersText },
        { key: "revision", label: "Enforced", render: revisionCell },
        { key: "actions", label: "Actions", render: rowActions },
      ].filter(Boolean), list, { id: "pilots-table", empty: "No pilots yet.", rowData: (p) => ({ pilotId: p.id, name: p.name, mode: p.mode }) }),
      h("h2", { id: "pilot-form-title" }, editingPilot ? `Edit pilot ${editingPilot.entity.name}` : "Create a pilot"),
      pilotForm());
  }

  // --- business units: their time zone, administrators and cap lock -------------------------

  let editingUnit = null; // {entity, etag}

  async function renderBusinessUnits() {
    const [out, admins] = await Promise.all([get("/admin/business-units"), isPlatform() ? getOr("/admin/admins", []) : Promise.resolve([])]);
    const list = Array.isArray(out) ? out : (out && (out.business_units || out.items)) || [];
    const adminLabel = (id) => { const a = (admins || []).find((x) => x.id === id); return a ? a.email : id; };
    const u = editingUnit ? editingUnit.entity : null;
    const problemsBox = h("div", { id: "unit-problems", role: "alert", tabindex: "-1", hidden: true });
    const form = h("form", { class: "grid panel", id: "unit-form", "aria-labelledby": "unit-form-title", novalidate: true },
      field("Unit name", "name", { id: "unit-name", required: true, value: u && u.name, hint: "As users' business_unit names it" }),
      field("Time zone", "timezone", { id: "unit-timezone", required: true, value: u ? u.timezone : browserTz, hint: "IANA name; local midnight is computed in it" }),
      multiPick("Administrators", "unit-admins", (admins || []).filter((a) => !a.is_super).map((a) => [a.id, a.email]), u && u.admins,
        "They manage this unit's people, rules and overrides (platform administrators are not listed). Ctrl or Cmd + click chooses several."),
      field("Daily cap lock (USD)", "daily_cap_lock_usd", { id: "unit-cap-lock", inputmode: "decimal", value: u && u.daily_cap_lock_usd, hint: "Empty: none. The unit's administrators cannot raise a daily cap above it" }),
      h("div", { class: "actions" },
        h("button", { type: "submit", id: "unit-submit" }, u ? "Save business unit" : "Create business unit"),
        u ? button("Cancel", () => { editingUnit = null; rerender(); }, "secondary", { id: "unit-cancel" }) : null));
    form.addEventListener("submit", async (ev) => {
      ev.preventDefault();
      const d = formData(form);
      const body = { name: d.name, timezone: d.timezone, admins: [...form.querySelector("#unit-admins").selectedOptions].map((o) => o.value),
        daily_cap_lock_usd: d.daily_cap_lock_usd === "" ? null : d.daily_cap_lock_usd };
      let saved;
      try {
        saved = u ? await api("PUT", `/admin/business-units/${encodeURIComponent(u.id)}`, body, editingUnit.etag ? { "if-match": editingUnit.etag } : {})
          : await api("POST", "/admin/business-units", body);
      } catch (err) {
        if (err.status === 401) return;
        problemList(problemsBox, problemsOf(err), `The business unit was refused (${err.code}):`);
        problemsBox.focus();
        return;
      }
      toast(pendingChange(saved) ? submittedText(saved) : `Business unit ${d.name} ${u ? "saved" : "created"}.`);
      editingUnit = null;
      rerender();
    });
    const rowActions = (x) => (isPlatform() ? button("Edit", async () => {
      const got = await act(() => api("GET", `/admin/business-units/${encodeURIComponent(x.id)}`));
      if (!got) return;
      editingUnit = { entity: got.data, etag: got.headers.get("etag") };
      await rerender();
      document.getElementById("unit-name").focus();
    }, "secondary", { "aria-label": `Edit business unit ${x.name}` }) : "—");
    page("Business units",
      h("p", {}, isPlatform()
        ? "Each unit has a time zone and administrators who manage only its people, rules and overrides; what they relax waits for approval."
        : "The units you administer."),
      table("Business units", [
        { key: "name", label: "Name" }, { key: "timezone", label: "Time zone" },
        { key: "admins", label: "Administrators", render: (x) => (x.admins || []).map((a) => (typeof a === "string" ? adminLabel(a) : a.email || a.id)).join(", ") || "None" },
        { key: "daily_cap_lock_usd", label: "Daily cap lock", num: true, render: (x) => (x.daily_cap_lock_usd === null || x.daily_cap_lock_usd === undefined ? "None" : `$${x.daily_cap_lock_usd}`) },
        { key: "actions", label: "Actions", render: rowActions },
      ], list, { id: "units-table", empty: "No business units yet.", rowData: (x) => ({ unitId: x.id, name: x.name }) }),
      isPlatform() ? [h("h2", { id: "unit-form-title" }, u ? `Edit business unit ${u.name}` : "Create a business unit"), form, problemsBox] : null);
  }

  // --- start -------------------------------------------------------------------------------------

  window.addEventListener("hashchange", () => {
    if (location.hash.startsWith("#/") || location.hash === "") route();
  });
  route();
})();
