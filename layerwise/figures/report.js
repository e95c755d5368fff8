// The script of `layerwise report` (layerwise/figures/report.py inlines it): the per-layer table, the per-layer
// charts and the curves over training (inline SVG) of the validation the slider picks. Plain JS, no library.
// A summary is data anyone can edit: every value of it reaches the page as text. Markup is built here from constants,
// numbers (Number(), toFixed) and esc(value) only; the page's Content-Security-Policy runs this script alone (by its
// hash), no inline handler and nothing remote, should a value ever slip through.
"use strict";
const SUMMARIES = JSON.parse(document.getElementById("summaries").textContent);
const META = JSON.parse(document.getElementById("meta").textContent);
const last = (row) => (Array.isArray(row) ? row[row.length - 1] : null);
// [key, title, values per layer, integers?, curves over training on a log axis?]
const COLUMNS = [
  ["accuracy", "accuracy", (s) => s.accuracy],
  ["loss", "loss", (s) => s.loss],
  ["perplexity", "perplexity", (s) => s.perplexity, false, true],
  ["f1", "F1", (s) => s.f1],
  ["exit_accuracy", "separate-head accuracy", (s) => s.exit_accuracy],
  ["cos_to_last", "COS to last", (s) => (s.cos ? s.cos.map(last) : null)],
  ["cka_to_last", "CKA to last", (s) => (s.cka ? s.cka.map(last) : null)],
  ["nc1", "NC1", (s) => s.nc1, false, true],
  ["cdnv", "CDNV", (s) => s.cdnv, false, true],
  ["nc2_etf", "NC2 ETF error", (s) => s.nc2_etf],
  ["nc3", "NC3", (s) => s.nc3],
  ["nc4_agreement", "NC4 agreement", (s) => s.nc4_agreement],
  ["saturation_counts", "saturating samples", (s) => s.saturation_counts, true],
  ["saturation_cos", "saturation COS", (s) => s.saturation_cos],
];
// the per-layer results of a user's analysis (the summary's analyses: {name: {columns: {key: title}}}) after the
// package's columns: read from the summary as data, a title as text
const KNOWN = new Set(COLUMNS.map((c) => c[0]));
function columnsOf(summaries) {
  const extra = new Map();
  for (const s of summaries) {
    for (const record of Object.values((s && s.analyses) || {})) {
      for (const [key, title] of Object.entries((record && record.columns) || {})) {
        if (!KNOWN.has(key) && !extra.has(key)) extra.set(key, [key, String(title), (x) => x[key]]);
      }
    }
  }
  return [...COLUMNS, ...extra.values()];
}
const esc = (v) => String(v).replace(/[&<>"']/g, (c) => ({"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;"})[c]);
const missing = (v) => v === null || v === undefined || !isFinite(v);
// decimals that give the largest magnitude of a column 4 significant digits: one count of decimals per column
function decimals(values) {
  const top = Math.max(0, ...values.filter((v) => !missing(v)).map((v) => Math.abs(Number(v))));
  return top === 0 ? 3 : Math.min(6, Math.max(0, 3 - Math.floor(Math.log10(top))));
}
// the fewest decimals that write every value of a column exactly (thresholds: 0.50, 0.95, 0.99), at most 6
function exactDecimals(values) {
  let d = 0;
  for (const v of values.filter((v) => !missing(v))) while (d < 6 && Math.abs(Math.round(v * 10 ** d) - v * 10 ** d) > 1e-6) d++;
  return d;
}
const fmt = (v, integer, digits) => (missing(v) ? "–" : integer ? String(Number(v)) : digits === undefined ? Number(v).toPrecision(4) : Number(v).toFixed(digits));
const sameOrder = (a, b) => a[0] === b[0] && a[1] === b[1];
const byStage = {};
META.records.forEach((r, i) => (byStage[r.stage] = byStage[r.stage] || []).push({order: r.order, s: SUMMARIES[i]}));
const at = (stage, order) => (byStage[stage] || []).find((x) => sameOrder(x.order, order));
const layerColor = (i) => META.layer_colors[i % META.layer_colors.length];
const seriesColor = (i) => META.series_colors[i % META.series_colors.length];
// one colour per quantity and a stage's name in words, both from figures/style.py (the figures use the same)
const quantityColor = (q) => META.quantity_colors[q];
const stageName = (stage) => META.stage_names[stage] || stage.replace(/_/g, " ");

// ticks of a log axis whose ends are lo and hi in log10: 1, 10, 100... and 2, 5 between them when few decades show
function logTicks(lo, hi) {
  const values = [];
  const steps = hi - lo < 1.5 ? [1, 2, 5] : [1];
  for (let e = Math.floor(lo); e <= Math.ceil(hi); e++) for (const m of steps) {
    const v = m * 10 ** e;
    if (Math.log10(v) >= lo - 1e-9 && Math.log10(v) <= hi + 1e-9) values.push(+v.toPrecision(12));
  }
  return {values, step: 0, log: true};
}

function ticks(lo, hi, n) {
  const span = hi - lo, raw = span / n, mag = Math.pow(10, Math.floor(Math.log10(raw)));
  const step = [1, 2, 2.5, 5, 10].map((m) => m * mag).find((m) => span / m <= n) || 10 * mag;
  const out = [];
  for (let v = Math.ceil(lo / step) * step; v <= hi + step * 1e-9; v += step) out.push(+v.toPrecision(12));
  return {values: out, step};
}

// a tick label with as many decimals as the tick step needs (1.6115, 1.612, 1.6125 rather than 1.612 three times)
function label(v, step) {
  if (step === 0) return String(+v.toPrecision(3));
  if (step >= 1) return String(Math.round(v * 1e6) / 1e6);
  let decimals = Math.ceil(-Math.log10(step) - 1e-9);
  while (decimals < 12 && Math.abs(Math.round(step * 10 ** decimals) - step * 10 ** decimals) > 1e-6) decimals++;
  return v.toFixed(decimals);
}

// series: [{name, color, xs, ys}]; null ys are gaps. timeline: a dashed line marks the slider's step (moveMarkers).
// log: the y axis in decades when every value is positive (a first epoch's NC1 of 60 would flatten later ones of 1)
function chart(title, xlabel, series, timeline, log) {
  const W = 390, H = 240, L = 62, R = 22, T = 22, B = 38;
  const xs = series.flatMap((s) => s.xs), finite = series.flatMap((s) => s.ys).filter((v) => !missing(v));
  if (!xs.length || !finite.length) return "";
  const logY = Boolean(log) && finite.every((v) => v > 0) && Math.max(...finite) / Math.min(...finite) > 3;
  const toY = (v) => (logY ? Math.log10(v) : v), ys = finite.map(toY);
  if (logY) title += " (log scale)";
  let [x0, x1] = [Math.min(...xs), Math.max(...xs)], [y0, y1] = [Math.min(...ys), Math.max(...ys)];
  if (x0 === x1) { x0 -= 1; x1 += 1; }
  if (y0 === y1) { const d = Math.abs(y0) * 0.05 || 0.5; y0 -= d; y1 += d; }
  const pad = (y1 - y0) * 0.05; y0 -= pad; y1 += pad;
  const X = (v) => L + ((v - x0) / (x1 - x0)) * (W - L - R), Y = (v) => H - B - ((toY(v) - y0) / (y1 - y0)) * (H - T - B);
  const scale = timeline ? ` data-x0="${x0}" data-x1="${x1}" data-left="${L}" data-width="${W - L - R}"` : "";
  let svg = `<svg class="chart"${scale} width="${W}" height="${H}" viewBox="0 0 ${W} ${H}" xmlns="http://www.w3.org/2000/svg" font-size="11">`;
  svg += `<text x="${W / 2}" y="14" text-anchor="middle" font-weight="bold">${esc(title)}</text>`;
  const yt = logY ? logTicks(y0, y1) : ticks(y0, y1, 5);
  for (const v of yt.values) svg += `<line x1="${L}" x2="${W - R}" y1="${Y(v)}" y2="${Y(v)}" stroke="#eee"/><text x="${L - 4}" y="${Y(v) + 4}" text-anchor="end">${label(v, yt.step)}</text>`;
  const integer = series.every((s) => s.integer);
  let xt = ticks(x0, x1, 6);
  if (integer && xt.step < 1) xt = {values: xt.values.filter(Number.isInteger), step: 1};
  for (const v of xt.values) svg += `<line x1="${X(v)}" x2="${X(v)}" y1="${H - B}" y2="${H - B + 4}" stroke="#888"/><text x="${X(v)}" y="${H - B + 15}" text-anchor="middle">${label(v, xt.step)}</text>`;
  svg += `<rect x="${L}" y="${T}" width="${W - L - R}" height="${H - T - B}" fill="none" stroke="#888"/>`;
  svg += `<text x="${(L + W - R) / 2}" y="${H - 6}" text-anchor="middle">${esc(xlabel)}</text>`;
  if (timeline) svg += `<line class="marker" x1="${L}" x2="${L}" y1="${T}" y2="${H - B}" stroke="#444" stroke-dasharray="4 3" visibility="hidden"/>`;
  const dots = Math.max(...series.map((s) => s.xs.length)) <= 60;
  for (const s of series) {
    let d = "", pen = false;
    s.xs.forEach((x, i) => {
      const y = s.ys[i];
      if (y === null || y === undefined || !isFinite(y)) { pen = false; return; }
      d += `${pen ? "L" : "M"}${X(x).toFixed(1)} ${Y(y).toFixed(1)}`; pen = true;
      if (dots) svg += `<circle cx="${X(x).toFixed(1)}" cy="${Y(y).toFixed(1)}" r="2" fill="${esc(s.color)}"/>`;
    });
    if (d) svg += `<path d="${d}" fill="none" stroke="${esc(s.color)}" stroke-width="1.6"/>`;
  }
  svg += "</svg>";
  const legend = series.map((s) => `<span><i class="sw" style="background:${esc(s.color)}"></i>${esc(s.name)}</span>`).join("");
  return `<div>${svg}<div class="legend">${legend}</div></div>`;
}

// one line per layer of a per-layer value over training (x: global step)
// colorOf(l): the colour of the l-th series (default: the l-th layer's)
function curves(stage, title, get, names, log, colorOf) {
  const rows = (byStage[stage] || []).map((x) => ({step: x.order[1], v: get(x.s)})).filter((r) => Array.isArray(r.v));
  if (!rows.length) return "";
  const width = Math.max(...rows.map((r) => r.v.length));
  const series = [];
  for (let l = 0; l < width; l++) {
    series.push({name: names ? names(l) : `layer ${l + 1}`, color: colorOf ? colorOf(l) : layerColor(l), integer: true,
      xs: rows.map((r) => r.step), ys: rows.map((r) => (r.v[l] === undefined ? null : r.v[l]))});
  }
  return chart(`${stageName(stage)}: ${title}`, "global step", series, true, log);
}

function layerNames(stage) {
  const s = (byStage[stage] || []).map((x) => x.s).find((s) => Array.isArray(s.layers));
  return (l) => `layer ${s ? s.layers[l] : l + 1}`;
}

// the colour of the l-th analysed layer of a stage: its layer number's, as in the figures (layers 7-12 of 12 are not
// coloured as layers 1-6)
function layerColors(stage) {
  const s = (byStage[stage] || []).map((x) => x.s).find((s) => Array.isArray(s.layers));
  return (l) => layerColor(s && Number.isInteger(s.layers[l]) ? s.layers[l] - 1 : l);
}

function table(stage, s) {
  const cols = columnsOf([s]).filter((c) => Array.isArray(c[2](s)));
  if (!Array.isArray(s.layers) || !cols.length) return "";
  const digits = cols.map((c) => decimals(c[2](s)));
  let h = `<table><tr><th>layer</th>${cols.map((c) => `<th>${esc(c[1])}</th>`).join("")}</tr>`;
  s.layers.forEach((layer, i) => (h += `<tr><td>${esc(layer)}</td>${cols.map((c, k) => `<td>${fmt(c[2](s)[i], c[3], digits[k])}</td>`).join("")}</tr>`));
  return h + "</table>";
}

function scalars(s) {
  const parts = [];
  // each whole-run number in words, never its key
  const counts = [["num_samples", "samples"], ["n_nonfinite", "non-finite values"], ["depth", "layers"]];
  const numbers = [["trajectory_lss", "trajectory line-shape score"], ["trajectory_expodistance", "trajectory expodistance"]];
  const depths = [["effective_depth", "ε-effective depth (accuracy ≥ 1 − ε)"], ["effective_depth_relative", "ε-effective depth (within ε of the last layer)"]];
  for (const [k, words] of counts) if (Number.isInteger(s[k])) parts.push(`${words} ${fmt(s[k], true)}`);
  for (const [k, words] of numbers) if (typeof s[k] === "number") parts.push(`${words} ${fmt(s[k])}`);
  // where no layer reaches 1 − ε the summary's depth is the last layer by convention: written as not reached
  const reached = (k, e) => !(k === "effective_depth" && s.effective_depth_reached && s.effective_depth_reached[e] === false);
  for (const [k, words] of depths) if (s[k]) parts.push(`${words}: ` + Object.entries(s[k]).map(([e, d]) => (reached(k, e) ? `ε ${esc(e)} → layer ${fmt(d, true)}` : `ε ${esc(e)} → not reached`)).join(", "));
  let exits = "";
  if (Array.isArray(s.early_exit) && s.early_exit.length) {
    // one column per exit layer, a number per cell; each column of decimals written to the same number of places
    const rows = s.early_exit, width = Math.max(...rows.map((r) => (r.exit_counts || []).length));
    const layers = Array.from({length: width}, (_, l) => (Array.isArray(s.layers) && s.layers[l] !== undefined ? s.layers[l] : l + 1));
    const places = {threshold: exactDecimals(rows.map((r) => r.threshold)), accuracy: decimals(rows.map((r) => r.accuracy)), speedup: decimals(rows.map((r) => r.speedup))};
    exits = `<table class="exits"><tr><th rowspan="2">early exit τ</th><th rowspan="2">accuracy</th><th rowspan="2">speedup</th><th colspan="${Number(width)}">samples exiting at layer</th></tr>`;
    exits += `<tr>${layers.map((l) => `<th>${esc(l)}</th>`).join("")}</tr>`;
    for (const r of rows) {
      const counts = layers.map((_, l) => `<td>${fmt((r.exit_counts || [])[l], true)}</td>`).join("");
      const speedup = missing(r.speedup) ? "–" : `×${fmt(r.speedup, false, places.speedup)}`;
      exits += `<tr><td>${fmt(r.threshold, false, places.threshold)}</td><td>${fmt(r.accuracy, false, places.accuracy)}</td><td>${speedup}</td>${counts}</tr>`;
    }
    exits += "</table>";
  }
  return `<p class="scalars">${parts.join(" · ")}</p>${exits}`;
}

function profile(stage, s) {
  if (!Array.isArray(s.layers)) return "";
  const series = [];
  [["accuracy", "accuracy", (t) => t.accuracy], ["COS to last", "cos", (t) => (t.cos ? t.cos.map(last) : null)], ["CKA to last", "cka", (t) => (t.cka ? t.cka.map(last) : null)]]
    .forEach(([name, quantity, get]) => { const v = get(s); if (Array.isArray(v)) series.push({name, color: quantityColor(quantity), integer: true, xs: s.layers, ys: v}); });
  return series.length ? chart(`${stageName(stage)}: per layer`, "layer", series, false) : "";
}

function render(index) {
  const order = META.steps[index];
  document.getElementById("steplabel").textContent = `epoch ${order[0]}, step ${order[1]} (${index + 1} of ${META.steps.length})`;
  let tables = "";
  for (const stage of META.stages) {
    const x = at(stage, order);
    tables += `<h3>${esc(stageName(stage))}</h3>` + (x ? `<div class="grid"><div>${table(stage, x.s)}</div>${profile(stage, x.s)}</div>${scalars(x.s)}` : "<p class=note>no summary at this validation</p>");
  }
  document.getElementById("tables").innerHTML = tables;
  moveMarkers(order[1]);
  const transfer = document.getElementById("transfercharts");
  if (transfer) {
    const series = [];
    META.stages.forEach((stage, i) => { const x = at(stage, order); if (x && Array.isArray(x.s.accuracy)) series.push({name: stageName(stage), color: seriesColor(i), integer: true, xs: x.s.layers, ys: x.s.accuracy}); });
    let rows = "";
    const stages = series.map((s) => s.name);
    if (series.length) {
      rows = `<table><tr><th>layer</th>${stages.map((s) => `<th>${esc(s)}</th>`).join("")}</tr>`;
      const digits = series.map((s) => decimals(s.ys));
      series[0].xs.forEach((layer, i) => (rows += `<tr><td>${esc(layer)}</td>${series.map((s, k) => `<td>${fmt(s.ys[i], false, digits[k])}</td>`).join("")}</tr>`));
      rows += "</table>";
    }
    transfer.innerHTML = `<div>${rows}</div>` + chart("accuracy per layer", "layer", series, false);
  }
}

// the curves over training: drawn once; the slider only moves their markers
function drawCurves() {
  let html = "";
  for (const stage of META.stages) {
    const names = layerNames(stage);
    let charts = "";
    const columns = columnsOf((byStage[stage] || []).map((x) => x.s));
    for (const [, title, get, , log] of columns) charts += curves(stage, title, get, names, log, layerColors(stage));
    if (charts) html += `<h3>${esc(stageName(stage))}</h3><div class="grid">${charts}</div>`;
  }
  document.getElementById("curvecharts").innerHTML = html;
  const coupling = document.getElementById("couplingcharts");
  if (coupling) {
    let h = "";
    for (const stage of META.stages) {
      const ks = ((byStage[stage] || []).find((x) => x.s.coupling) || {s: {coupling: {ks: []}}}).s.coupling.ks;
      h += curves(stage, "coupling score per K", (s) => (s.coupling ? s.coupling.coupling_score : null), (i) => `K = ${ks[i]}`);
      h += curves(stage, "coupling: trajectory LSS", (s) => (s.coupling ? [s.coupling.trajectory_lss] : null), () => "LSS");
      h += curves(stage, "coupling: 1/σ1 per block", (s) => (s.coupling ? s.coupling.inverse_sigma_1 : null), (i) => `block ${i + 1}`);
    }
    coupling.innerHTML = h;
  }
  const compare = document.getElementById("comparisoncharts");
  if (compare) {
    let h = "";
    for (const stage of META.stages) {
      h += curves(stage, "arccos distance to model B", (s) => (s.compare && s.compare.arccos_distance !== undefined ? [s.compare.arccos_distance] : null), () => "arccos distance");
      h += curves(stage, "CKA(A layer l, B layer l)", (s) => (s.compare && JSON.stringify(s.compare.layers_a) === JSON.stringify(s.compare.layers_b) ? s.compare.cka.map((row, i) => row[i]) : null), (i) => `layer ${((byStage[stage] || []).map((x) => x.s.compare).find(Boolean) || {layers_a: []}).layers_a[i]}`);
    }
    compare.innerHTML = h;
  }
  const detection = document.getElementById("detectioncharts");
  if (detection) {
    let h = "";
    for (const stage of META.stages) h += curves(stage, "AP50 per decoder layer", (s) => s.detection_ap50, (i) => `decoder layer ${i + 1}`);
    detection.innerHTML = h;
  }
}

function moveMarkers(step) {
  for (const svg of document.querySelectorAll("svg.chart[data-x0]")) {
    const x0 = Number(svg.dataset.x0), x1 = Number(svg.dataset.x1), line = svg.querySelector("line.marker");
    const x = Number(svg.dataset.left) + ((step - x0) / (x1 - x0)) * Number(svg.dataset.width);
    line.setAttribute("x1", x);
    line.setAttribute("x2", x);
    line.setAttribute("visibility", step >= x0 && step <= x1 ? "visible" : "hidden");
  }
}

const slider = document.getElementById("step");
slider.max = String(META.steps.length - 1);
slider.value = String(Math.max(0, META.steps.findIndex((o) => sameOrder(o, META.chosen))));
slider.addEventListener("input", () => render(Number(slider.value)));
drawCurves();
render(Number(slider.value));
