// The coordinator's dashboard: polls the JSON API (at most once a second, the next poll
// set after each answer) and draws the cluster, the jobs and one job's curves, Gantt,
// memory and events as plain DOM and SVG. A job page asks only for the steps after the
// ones it has (?since_step=N). When the coordinator does not answer it shows
// "reconnecting" and keeps polling until it does.
'use strict';

const POLL_MS = 1000;
const LOGS_EVERY = 5;  // polls between two reads of a job's log lines
const $ = (sel) => document.querySelector(sel);
// Charts are drawn at their box's width in pixels, so text keeps its size.
const widthOf = (sel) => Math.max(document.querySelector(sel).clientWidth, 300);

const page = {
  jobId: null,
  job: null,          // the latest JobStatus, without history
  steps: [],          // every StepRecord so far, in step order
  lastStep: 0,
  cluster: null,
  timeline: null,
  predicted: null,
  timelineStep: -1,
  logs: [],
  polls: 0,
};

function routeJobId() {
  const m = location.pathname.match(/^\/jobs\/([^/]+)$/) || location.hash.match(/^#\/jobs\/([^/]+)$/);
  return m ? decodeURIComponent(m[1]) : null;
}

class HttpError extends Error {
  constructor(status, message) { super(message); this.status = status; }
}

async function getJson(url) {
  const r = await fetch(url, {credentials: 'same-origin', cache: 'no-store'});
  if (r.status === 401) {  // the login cookie went (or the token changed): the form again
    location.reload();
    throw new HttpError(401, 'not logged in');
  }
  if (!r.ok) {
    let message = r.statusText;
    try { message = (await r.json()).error || message; } catch (e) { /* not JSON */ }
    throw new HttpError(r.status, message);
  }
  return r.json();
}

function setConnected(ok) {
  const el = $('#conn-status');
  el.textContent = ok ? 'live' : 'reconnecting';
  el.className = ok ? 'ok' : 'reconnecting';
}

// ---- formatting ----

function esc(text) {
  return String(text).replace(/[&<>"']/g, (c) => ({'&': '&amp;', '<': '&lt;', '>': '&gt;',
    '"': '&quot;', "'": '&#39;'}[c]));
}
function fmtBytes(n) {
  n = Number(n);
  if (!n) return '-';
  const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; ++i; }
  return n.toFixed(i ? 1 : 0) + ' ' + units[i];
}
function fmtNum(x, digits) {
  return x === undefined || x === null || Number.isNaN(x) ? '-' : Number(x).toFixed(digits);
}
// A learning rate: 3.00e-4 (what the step's record says, the schedule's rate).
function fmtLr(x) {
  return x === undefined || x === null ? '-' : Number(x).toExponential(2);
}
function fmtDuration(s) {
  if (!Number.isFinite(s) || s < 0) return '-';
  if (s < 60) return Math.round(s) + 's';
  if (s < 3600) return Math.floor(s / 60) + 'm' + String(Math.round(s % 60)).padStart(2, '0') + 's';
  return Math.floor(s / 3600) + 'h' + String(Math.floor((s % 3600) / 60)).padStart(2, '0') + 'm';
}
function totalSteps(job) { return Number(((job.spec || {}).training || {}).steps || 0); }
function eta(job, record) {
  if (!record || (job.state !== 'RUNNING' && job.state !== 'RECOVERING')) return '-';
  return fmtDuration((totalSteps(job) - Number(job.steps_done)) * record.step_time_s);
}

// ---- overview: cluster and jobs ----

function renderCluster(cluster) {
  const now = Date.now();
  const rows = (cluster.stages || []).map((s) => {
    const beat = s.last_heartbeat ? (now - Date.parse(s.last_heartbeat)) / 1000 : NaN;
    const device = s.device || {};
    return `<tr data-stage="${esc(s.stage_id)}" data-address="${esc(s.address)}"` +
      ` class="${s.state === 'LOST' ? 'lost' : ''}"><td>${esc(s.stage_id)}</td>` +
      `<td>${esc(s.address)}</td><td>${esc(device.name || device.kind || '')}</td>` +
      `<td class="num">${fmtBytes(device.memory_bytes)}</td>` +
      `<td class="num">${Number.isFinite(beat) ? beat.toFixed(1) + ' s ago' : '-'}</td>` +
      `<td class="stage-state">${esc(s.state)}</td>` +
      `<td>${s.job_id ? `<a href="/jobs/${encodeURIComponent(s.job_id)}">${esc(s.job_id)}</a>` : ''}</td></tr>`;
  });
  $('#cluster tbody').innerHTML = rows.join('') || '<tr><td colspan="7">no stages registered</td></tr>';
}

function renderJobs(jobs) {
  const filter = $('#state-filter').value;
  const rows = jobs.filter((j) => !filter || j.state === filter).map((j) => {
    const last = (j.history || [])[(j.history || []).length - 1];
    return `<tr data-job="${esc(j.job_id)}" data-state="${esc(j.state)}">` +
      `<td><a href="/jobs/${encodeURIComponent(j.job_id)}">${esc(j.job_id)}</a></td>` +
      `<td>${esc((j.spec || {}).name || '')}</td><td class="job-state">${esc(j.state)}</td>` +
      `<td class="num steps">${Number(j.steps_done)} / ${totalSteps(j)}</td>` +
      `<td class="num loss">${last ? fmtNum(last.loss, 4) : '-'}</td>` +
      `<td class="num">${last ? fmtNum(last.tokens_per_s, 0) : '-'}</td>` +
      `<td class="num">${eta(j, last)}</td></tr>`;
  });
  $('#jobs tbody').innerHTML = rows.join('') || '<tr><td colspan="7">no jobs</td></tr>';
}

let lastJobs = [];
async function pollOverview() {
  const [cluster, jobs] = await Promise.all([getJson('/api/cluster'), getJson('/api/jobs')]);
  renderCluster(cluster);
  lastJobs = jobs.jobs || [];
  renderJobs(lastJobs);
}

// ---- charts ----

// TensorBoard's smoothing: an exponential moving average, debiased so that the first
// points are not pulled towards 0.
function smooth(values, weight) {
  let last = 0;
  return values.map((v, i) => {
    last = last * weight + (1 - weight) * v;
    return weight > 0 ? last / (1 - Math.pow(weight, i + 1)) : v;
  });
}

// A line chart as SVG: series [{cls, points: [[x, y], ...]}], x and y axes with the
// range's ends labelled; log: a log10 y axis.
function lineChart(series, {width = 800, height = 220, log = false, yFormat = (v) => v.toPrecision(3)} = {}) {
  const SVG_W = width;
  const pad = {l: 56, r: 10, t: 8, b: 22};
  const all = series.flatMap((s) => s.points);
  if (all.length === 0) return `<svg viewBox="0 0 ${SVG_W} ${height}"><text x="${SVG_W / 2}" y="${height / 2}" text-anchor="middle">no steps yet</text></svg>`;
  const ty = (v) => (log ? Math.log10(Math.max(v, 1e-12)) : v);
  let x0 = Math.min(...all.map((p) => p[0])), x1 = Math.max(...all.map((p) => p[0]));
  let y0 = Math.min(...all.map((p) => ty(p[1]))), y1 = Math.max(...all.map((p) => ty(p[1])));
  if (x1 === x0) { x0 -= 1; x1 += 1; }
  if (y1 === y0) { const d = Math.abs(y0) / 2 || 0.5; y0 -= d; y1 += d; }  // a flat line, centred
  const w = SVG_W - pad.l - pad.r, h = height - pad.t - pad.b;
  const sx = (x) => pad.l + ((x - x0) / (x1 - x0)) * w;
  const sy = (y) => pad.t + (1 - (ty(y) - y0) / (y1 - y0)) * h;
  const untransform = (v) => (log ? Math.pow(10, v) : v);
  let out = `<svg viewBox="0 0 ${SVG_W} ${height}">`;
  out += `<line class="axis" x1="${pad.l}" y1="${pad.t + h}" x2="${pad.l + w}" y2="${pad.t + h}"/>`;
  out += `<line class="axis" x1="${pad.l}" y1="${pad.t}" x2="${pad.l}" y2="${pad.t + h}"/>`;
  for (const f of [0, 0.5, 1]) {
    const yv = y0 + f * (y1 - y0);
    out += `<text x="${pad.l - 4}" y="${pad.t + (1 - f) * h + 4}" text-anchor="end">${esc(yFormat(untransform(yv)))}</text>`;
  }
  out += `<text x="${pad.l}" y="${height - 6}">${Math.round(x0)}</text>`;
  out += `<text x="${pad.l + w}" y="${height - 6}" text-anchor="end">step ${Math.round(x1)}</text>`;
  for (const s of series) {
    if (s.points.length === 0) continue;
    const pts = s.points.map((p) => `${sx(p[0]).toFixed(1)},${sy(p[1]).toFixed(1)}`).join(' ');
    out += `<polyline class="${s.cls}" points="${pts}"/>`;
  }
  return out + '</svg>';
}

function renderCurves() {
  const steps = page.steps;
  const log = $('#log-scale').checked;
  const weight = Number($('#smoothing').value);
  $('#smoothing-value').textContent = weight.toFixed(2);
  const loss = steps.map((r) => [Number(r.step), r.loss]);
  const smoothed = smooth(loss.map((p) => p[1]), weight);
  const val = steps.filter((r) => r.has_val_loss).map((r) => [Number(r.step), r.val_loss]);
  $('#loss-curve').innerHTML = lineChart([
    {cls: 'raw loss', points: loss},
    {cls: 'smoothed loss', points: loss.map((p, i) => [p[0], smoothed[i]])},
    {cls: 'val', points: val},
  ], {log, width: widthOf('#loss-curve'), height: 260});
  $('#tps-curve').innerHTML = lineChart([{cls: 'tps', points: steps.map((r) => [Number(r.step), r.tokens_per_s])}],
    {width: widthOf('#tps-curve'), height: 160, yFormat: (v) => v.toFixed(0)});
  $('#lr-curve').innerHTML = lineChart([{cls: 'lr', points: steps.map((r) => [Number(r.step), Number(r.lr)])}],
    {width: widthOf('#lr-curve'), height: 160, yFormat: fmtLr});
  $('#bubble-curve').innerHTML = lineChart([
    {cls: 'measured', points: steps.map((r) => [Number(r.step), r.bubble_measured])},
    {cls: 'predicted', points: steps.map((r) => [Number(r.step), r.bubble_predicted])},
  ], {width: widthOf('#bubble-curve'), height: 160, yFormat: (v) => v.toFixed(2)});
}

// ---- the Gantt ----

const KINDS = {
  FORWARD: ['F', '#4e79a7'], BACKWARD: ['B', '#59a14f'], BACKWARD_INPUT: ['I', '#8cd17d'],
  BACKWARD_WEIGHT: ['W', '#f28e2b'], SEND_ACTIVATION: ['SEND', '#bab0ac'],
  SEND_GRADIENT: ['SEND', '#bab0ac'], RECV_ACTIVATION: ['RECV', '#d4a6c8'],
  RECV_GRADIENT: ['RECV', '#d4a6c8'], OPTIMIZER_STEP: ['OPT', '#e15759'],
};
function kindOf(e) { return KINDS[(e.action || {}).kind] || ['?', '#999']; }

function latestStepEvents(timeline) {
  const events = (timeline && timeline.events) || [];
  const last = Math.max(...events.map((e) => Number(e.step)));
  return events.filter((e) => Number(e.step) === last);
}

// One block of rows, a row per stage: compute above, link (send/receive) below.
function ganttRows(events, stages, y0, sx, {rowClass, title}) {
  const rowH = 34;
  let out = '';
  stages.forEach((s, i) => {
    const y = y0 + i * rowH;
    out += `<g class="${rowClass}" data-stage="${s}"><text x="4" y="${y + 15}">${title} ${s}</text>`;
    for (const e of events.filter((ev) => (ev.stage || 0) === s)) {
      const [label, colour] = kindOf(e);
      const link = e.lane === 'link';
      const x = sx(Number(e.start_us)), rw = Math.max(sx(Number(e.end_us)) - x, 0.5);
      const a = e.action || {};
      out += `<rect class="action kind-${label}" x="${x.toFixed(2)}" y="${y + (link ? 20 : 2)}" width="${rw.toFixed(2)}"` +
        ` height="${link ? 8 : 16}" fill="${colour}"><title>${esc(label)} mb ${a.micro_batch || 0}` +
        ` chunk ${a.chunk || 0}: ${Number(e.start_us)}-${Number(e.end_us)} us</title></rect>`;
    }
    out += '</g>';
  });
  return out;
}

// The measured step above the simulator's prediction of it, on one time axis.
function renderGantt() {
  const events = latestStepEvents(page.timeline);
  if (events.length === 0) {
    $('#gantt').innerHTML = '<p class="note">no timeline yet</p>';
    return;
  }
  const step = Number(events[0].step);
  $('#gantt-step').textContent = step;
  const predicted = ((page.predicted && page.predicted.events) || [])
    .filter((e) => Number(e.step) === step);
  const stages = [...new Set(events.map((e) => e.stage || 0))].sort((a, b) => a - b);
  const end = Math.max(...events.concat(predicted).map((e) => Number(e.end_us)), 1);
  const SVG_W = widthOf('#gantt');
  const pad = {l: 92, r: 10}, rowH = 34, top = 4, gap = 18, axisH = 20;
  const w = SVG_W - pad.l - pad.r;
  const sx = (us) => pad.l + (us / end) * w;
  const predictedTop = top + stages.length * rowH + gap;
  const height = (predicted.length ? predictedTop + stages.length * rowH : top + stages.length * rowH) + axisH;
  let out = `<svg viewBox="0 0 ${SVG_W} ${height}">`;
  out += ganttRows(events, stages, top, sx, {rowClass: 'row', title: 'stage'});
  if (predicted.length) {
    out += `<text class="block-title" x="4" y="${predictedTop - 5}">predicted from the costs measured before step ${step}</text>`;
    out += ganttRows(predicted, stages, predictedTop, sx, {rowClass: 'row-predicted', title: 'predicted'});
  }
  const axisY = height - axisH;
  out += `<line class="axis" x1="${pad.l}" y1="${axisY}" x2="${pad.l + w}" y2="${axisY}"/>`;
  out += `<text x="${pad.l}" y="${axisY + 14}">0</text><text x="${pad.l + w}" y="${axisY + 14}" text-anchor="end">${(end / 1000).toFixed(1)} ms</text>`;
  $('#gantt').innerHTML = out + '</svg>';
  const seen = new Map(Object.values(KINDS).map(([l, c]) => [l, c]));
  $('#gantt-legend').innerHTML = [...seen].map(([l, c]) =>
    `<span class="key" style="background:${c}"></span>${l}`).join(' ') +
    ' &middot; compute above, link (send/receive) below in each row';
  $('#gantt-note').textContent = predicted.length
    ? 'Measured step above; below, the simulator\'s prediction of the same step from each ' +
      'action\'s mean cost measured on the steps before it. Where they differ: the runtime\'s own overhead, and the spread of the actions\' times.'
    : 'Measured step; the prediction appears after the first step.';
}

// The timeline as Chrome trace JSON (chrome://tracing, Perfetto), as client/chrome_trace.cc
// writes it for `pipetrain timeline`: a process per stage, compute and link threads.
function chromeTrace(timeline) {
  const events = timeline.events || [];
  const stepEnd = new Map();
  for (const e of events) {
    const s = Number(e.step);
    stepEnd.set(s, Math.max(stepEnd.get(s) || 0, Number(e.end_us)));
  }
  const offset = new Map();
  let at = 0;
  for (const s of [...stepEnd.keys()].sort((a, b) => a - b)) { offset.set(s, at); at += Math.max(stepEnd.get(s), 0); }
  const out = [];
  for (const s of [...new Set(events.map((e) => e.stage || 0))].sort((a, b) => a - b)) {
    out.push({name: 'process_name', ph: 'M', pid: s, tid: 0, args: {name: `stage ${s}`}});
    out.push({name: 'process_sort_index', ph: 'M', pid: s, tid: 0, args: {sort_index: s}});
    out.push({name: 'thread_name', ph: 'M', pid: s, tid: 0, args: {name: 'compute'}});
    out.push({name: 'thread_name', ph: 'M', pid: s, tid: 1, args: {name: 'link'}});
  }
  for (const e of events) {
    const a = e.action || {};
    const [label] = kindOf(e);
    out.push({name: `${label}${a.kind === 'OPTIMIZER_STEP' ? '' : a.micro_batch || 0}`,
      cat: e.lane || 'compute', ph: 'X', pid: e.stage || 0, tid: e.lane === 'link' ? 1 : 0,
      ts: offset.get(Number(e.step)) + Number(e.start_us),
      dur: Math.max(0, Number(e.end_us) - Number(e.start_us)),
      args: {step: Number(e.step), micro_batch: a.micro_batch || 0, chunk: a.chunk || 0, bytes: Number(e.bytes || 0)}});
  }
  return {traceEvents: out, displayTimeUnit: 'ms'};
}

async function downloadTrace() {
  const timeline = await getJson(`/api/jobs/${encodeURIComponent(page.jobId)}/timeline?steps=20`);
  const blob = new Blob([JSON.stringify(chromeTrace(timeline))], {type: 'application/json'});
  const a = document.createElement('a');
  a.href = URL.createObjectURL(blob);
  a.download = `${page.jobId}-trace.json`;
  document.body.appendChild(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(a.href), 10000);
}

// ---- memory and events ----

function renderMemory() {
  const last = page.steps[page.steps.length - 1];
  const byId = new Map(((page.cluster || {}).stages || []).map((s) => [s.stage_id, s]));
  const ids = page.job.stage_ids || [];
  const rows = ((last && last.stages) || []).map((st) => {
    const index = st.stage || 0;
    const info = byId.get(ids[index]);
    const limit = info ? Number((info.device || {}).memory_bytes) : 0;
    const used = Number(st.peak_memory_bytes);
    const share = limit ? Math.min(used / limit, 1) : 0;
    return `<tr data-stage="${index}"><td>${index}</td><td class="num">${fmtBytes(used)}</td>` +
      `<td class="num">${limit ? fmtBytes(limit) : 'no limit'}</td><td><div class="bar-box"><div class="bar" style="width:${(share * 100).toFixed(1)}%"></div></div></td></tr>`;
  });
  $('#memory tbody').innerHTML = rows.join('') || '<tr><td colspan="4">no steps yet</td></tr>';
}

// What a restart continued on: "3 stages", or with replicas "1 replica of 2 stages".
function recoveryLayout(r) {
  const replicas = Math.max(1, Number(r.replicas || 1));
  const before = Number((((page.job.spec || {}).pipeline) || {}).replicas || 1);
  const stages = Number(r.stages || 0);
  if (before <= 1 && replicas === 1) return `${stages} stages`;
  return `${replicas} ${replicas === 1 ? 'replica' : 'replicas'} of ${stages / replicas} stages`;
}

function renderEvents() {
  const items = page.logs.map((l) => `<li><span class="time">${esc(l.time.replace('T', ' ').replace(/\.\d+Z$/, 'Z'))}</span> ${esc(l.text)}</li>`);
  for (const r of page.job.recoveries || []) {
    items.push(`<li class="recovery">recovery: stage(s) ${esc((r.lost_stage_ids || []).join(', '))} lost at step ` +
      `${Number(r.failed_step)}, continued from step ${Number(r.restored_step)} (${esc(r.source)}) on ${recoveryLayout(r)}</li>`);
  }
  $('#events').innerHTML = items.join('') || '<li>no events yet</li>';
}

// ---- the job page ----

function addSteps(history) {
  for (const r of history) {
    const step = Number(r.step);
    // A restart may record a step again: what comes later replaces it and what follows.
    if (step <= page.lastStep) page.steps = page.steps.filter((x) => Number(x.step) < step);
    page.steps.push(r);
    page.lastStep = step;
  }
}

function renderJobHead() {
  const job = page.job, last = page.steps[page.steps.length - 1];
  $('#job-title').textContent = `${job.job_id} ${(job.spec || {}).name || ''}`;
  $('#job-state').textContent = job.state;
  document.querySelector('.step-counter').textContent = Number(job.steps_done);
  $('#job-steps-total').textContent = totalSteps(job);
  $('#job-loss').textContent = last ? fmtNum(last.loss, 4) : '-';
  $('#job-tps').textContent = last ? fmtNum(last.tokens_per_s, 0) : '-';
  $('#job-lr').textContent = last ? fmtLr(last.lr) : '-';
  $('#job-eta').textContent = eta(job, last);
  $('#job-reason').textContent = job.reason ? `(${job.reason})` : '';
}

async function pollJob() {
  const id = encodeURIComponent(page.jobId);
  const [job, cluster] = await Promise.all([getJson(`/api/jobs/${id}?since_step=${page.lastStep}`), getJson('/api/cluster')]);
  const added = (job.history || []).length;
  addSteps(job.history || []);
  delete job.history;
  const stateChanged = !page.job || page.job.state !== job.state;
  page.job = job;
  page.cluster = cluster;
  renderJobHead();
  if (added > 0 || page.polls === 0) renderCurves();
  if (added > 0 || page.polls === 0) {
    [page.timeline, page.predicted] = await Promise.all([
      getJson(`/api/jobs/${id}/timeline?steps=1`),
      getJson(`/api/jobs/${id}/timeline?predicted=1`)]);
    renderGantt();
  }
  if (stateChanged || page.polls % LOGS_EVERY === 0) {
    page.logs = (await getJson(`/api/jobs/${id}/logs`)).logs || [];
  }
  renderMemory();
  renderEvents();
  page.polls += 1;
}

function showNotFound(message) {
  $('#overview').hidden = true;
  $('#job-view').hidden = true;
  $('#not-found').hidden = false;
  $('#not-found-text').textContent = message;
}

async function poll() {
  try {
    if (page.jobId) await pollJob(); else await pollOverview();
    setConnected(true);
  } catch (e) {
    if (e.status === 404 && page.jobId) {
      showNotFound(`The coordinator has no job '${page.jobId}'.`);
      return;  // nothing to follow
    }
    if (e.status === 401) return;  // reloading into the login form
    setConnected(false);
  }
  setTimeout(poll, POLL_MS);
}

function start() {
  page.jobId = routeJobId();
  $('#overview').hidden = !!page.jobId;
  $('#job-view').hidden = !page.jobId;
  if (page.jobId) document.title = `pipetrain: ${page.jobId}`;
  $('#state-filter').addEventListener('change', () => renderJobs(lastJobs));
  $('#log-scale').addEventListener('change', renderCurves);
  $('#smoothing').addEventListener('input', renderCurves);
  $('#download-trace').addEventListener('click', () => downloadTrace().catch((e) => alert(`trace: ${e.message}`)));
  window.addEventListener('hashchange', () => location.reload());
  poll();
}

start();
