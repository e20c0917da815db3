// meshrun's dashboard: jobs, workers and live telemetry charts of the selected job.
// Data: JSON from /api/*, telemetry from the server-sent-event stream /api/watch (backfilled
// from the coordinator's history, then live; the browser resumes with Last-Event-ID).
import uPlot from 'uplot';
import 'uplot/dist/uPlot.min.css';
import './style.css';

const $ = (selector) => document.querySelector(selector);
const PALETTE = ['#2563eb', '#dc2626', '#059669', '#d97706', '#7c3aed', '#0891b2'];

let selectedJob = null;
let stream = null;
let charts = new Map();   // series name -> chart (line or heatmap)
let jobsById = new Map();
let latestStep = 0;       // newest summary step of the selected job

function short(state, prefix) {
  return (state || '').replace(prefix, '').toLowerCase();
}

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (key === 'class') node.className = value;
    else if (key.startsWith('on')) node.addEventListener(key.slice(2), value);
    else node.setAttribute(key, value);
  }
  for (const child of children) node.append(child);
  return node;
}

function emptyRow(columns, text) {
  return el('tr', {}, el('td', { colspan: String(columns), class: 'muted' }, text));
}

async function getJson(path) {
  const response = await fetch(path, { cache: 'no-store' });
  const body = await response.json();
  if (!response.ok) throw new Error(body.error || `${path}: HTTP ${response.status}`);
  return body;
}

function formatBytes(bytes) {
  if (bytes === undefined || bytes === null) return '';
  const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
  let value = Number(bytes);
  let unit = 0;
  while (value >= 1024 && unit < units.length - 1) { value /= 1024; unit++; }
  return `${value.toFixed(unit ? 1 : 0)} ${units[unit]}`;
}

function ago(micros) {
  const seconds = (Date.now() * 1000 - Number(micros)) / 1e6;
  if (!Number(micros)) return '';
  if (seconds < 60) return `${Math.max(0, seconds).toFixed(1)} s ago`;
  return `${(seconds / 60).toFixed(0)} min ago`;
}

// ---- line charts ----------------------------------------------------------------------

class LineChart {
  constructor(title, labels, unit) {
    this.title = title;
    this.steps = [];
    this.columns = labels.map(() => []);
    this.box = el('div', { class: 'chart', 'data-series': title, 'data-points': '0' });
    this.box.append(el('div', { class: 'chart-title' }, title + (unit ? ` (${unit})` : '')));
    this.latest = el('span', { class: 'chart-latest' });
    this.box.firstChild.append(this.latest);
    this.waiting = el('div', { class: 'waiting' }, 'waiting for the first summary…');
    const plot = el('div');
    this.box.append(this.waiting, plot);
    $('#charts').append(this.box);
    const width = Math.max(280, plot.clientWidth || 400);
    this.plot = new uPlot({
      width,
      height: 190,
      legend: { show: labels.length > 1 },
      cursor: { drag: { x: true, y: false } },
      scales: { x: { time: false } },
      axes: [
        { stroke: '#64748b', grid: { stroke: '#eef2f7' }, ticks: { stroke: '#e2e8f0' } },
        { stroke: '#64748b', grid: { stroke: '#eef2f7' }, ticks: { stroke: '#e2e8f0' }, size: 56 },
      ],
      series: [{ label: 'step' }, ...labels.map((label, i) => ({
        label,
        stroke: PALETTE[i % PALETTE.length],
        width: 2,
        points: { show: false },
      }))],
    }, [this.steps, ...this.columns], plot);
    new ResizeObserver(() => {
      const w = plot.clientWidth;
      if (w > 0 && Math.abs(w - this.plot.width) > 2) this.plot.setSize({ width: w, height: 190 });
    }).observe(plot);
  }

  add(step, values) {
    if (this.steps.length && step <= this.steps[this.steps.length - 1]) return;
    this.steps.push(step);
    values.forEach((v, i) => this.columns[i].push(v));
    this.dirty = true;
  }

  // The job restarted from the checkpoint of `step`: the steps after it come again.
  rewind(step) {
    let keep = this.steps.length;
    while (keep > 0 && this.steps[keep - 1] > step) keep--;
    this.steps.length = keep;
    for (const column of this.columns) column.length = keep;
    this.dirty = true;
  }

  draw() {
    if (!this.dirty) return;
    this.dirty = false;
    this.plot.setData([this.steps, ...this.columns]);
    this.waiting.remove();
    this.box.dataset.points = String(this.steps.length);
    this.box.dataset.lastStep = String(this.steps.at(-1) ?? '');
    const last = this.columns[0][this.columns[0].length - 1];
    this.latest.textContent = Number.isFinite(last) ? last.toPrecision(4) : '';
  }
}

// ---- heatmap (e.g. sink mass per layer and head) --------------------------------------

function viridis(t) {
  const stops = [[68, 1, 84], [59, 82, 139], [33, 145, 140], [94, 201, 98], [253, 231, 37]];
  const x = Math.min(1, Math.max(0, t)) * (stops.length - 1);
  const i = Math.min(stops.length - 2, Math.floor(x));
  const f = x - i;
  const c = stops[i].map((a, k) => Math.round(a + (stops[i + 1][k] - a) * f));
  return `rgb(${c[0]},${c[1]},${c[2]})`;
}

class Heatmap {
  // caption: what the rows and columns are, from the job's telemetry declaration (e.g.
  // "layer × head"); without one, "rows × columns".
  constructor(title, shape, caption) {
    this.rows = shape.length >= 2 ? shape[0] : 1;
    this.cols = shape.length >= 2 ? shape.slice(1).reduce((a, b) => a * b, 1) : shape[0] || 1;
    this.points = 0;
    this.box = el('div', { class: 'chart heatmap', 'data-series': title, 'data-points': '0' });
    this.caption = el('span', { class: 'chart-latest' });
    const axes = (caption || 'row × column').split('×').map((a) => a.trim());
    this.rowLabel = axes[0] || 'row';
    this.colLabel = axes[1] || 'column';
    this.box.append(el('div', { class: 'chart-title' },
      `${title} (${caption || 'rows × columns'})`, this.caption));
    this.canvas = el('canvas');
    this.waiting = el('div', { class: 'waiting' }, 'waiting for the first summary…');
    this.box.append(this.waiting, this.canvas);
    $('#charts').append(this.box);
  }

  rewind() {}  // shows the newest step only; the re-run steps replace it as they come

  add(step, values) {
    this.step = step;
    this.values = values;
    this.points++;
    this.dirty = true;
  }

  draw() {
    if (!this.dirty) return;
    this.dirty = false;
    this.box.dataset.points = String(this.points);
    this.caption.textContent = `step ${this.step}`;
    this.waiting.remove();
    const ratio = window.devicePixelRatio || 1;
    const width = Math.max(280, this.box.clientWidth - 24);
    const left = 58, top = 20, bottom = 22;
    const cell = Math.min(36, (width - left - 8) / this.cols);
    const height = top + bottom + cell * this.rows;
    this.canvas.width = width * ratio;
    this.canvas.height = height * ratio;
    this.canvas.style.width = `${width}px`;
    this.canvas.style.height = `${height}px`;
    const g = this.canvas.getContext('2d');
    g.scale(ratio, ratio);
    g.font = '11px system-ui, sans-serif';
    const finite = this.values.filter(Number.isFinite);
    const lo = Math.min(...finite), hi = Math.max(...finite);
    const gridWidth = cell * this.cols;
    for (let r = 0; r < this.rows; r++) {
      g.fillStyle = '#64748b';
      g.textAlign = 'right';
      g.textBaseline = 'middle';
      g.fillText(this.rows > 1 ? `${this.rowLabel} ${r}` : '', left - 6, top + cell * (r + 0.5));
      for (let c = 0; c < this.cols; c++) {
        const v = this.values[r * this.cols + c];
        const t = hi > lo ? (v - lo) / (hi - lo) : 0.5;
        g.fillStyle = Number.isFinite(v) ? viridis(t) : '#e2e8f0';
        g.fillRect(left + c * cell, top + r * cell, cell - 1, cell - 1);
        if (cell >= 30) {
          g.fillStyle = t > 0.6 ? '#1e293b' : '#f8fafc';
          g.textAlign = 'center';
          const label = Number.isFinite(v) ? v.toFixed(2) : '–';
          g.fillText(label, left + (c + 0.5) * cell, top + (r + 0.5) * cell);
        }
      }
    }
    g.fillStyle = '#64748b';
    g.textAlign = 'center';
    g.textBaseline = 'bottom';
    for (let c = 0; c < this.cols; c++) {
      g.fillText(`${this.colLabel.slice(0, 1)}${c}`, left + (c + 0.5) * cell, top - 4);
    }
    // Colour scale beside the grid.
    const scaleX = left + gridWidth + 16;
    if (scaleX + 70 < width) {
      for (let i = 0; i < 100; i++) {
        g.fillStyle = viridis(1 - i / 99);
        g.fillRect(scaleX, top + (cell * this.rows) * i / 100, 10, cell * this.rows / 100 + 1);
      }
      g.fillStyle = '#64748b';
      g.textAlign = 'left';
      g.textBaseline = 'top';
      g.fillText(hi.toFixed(3), scaleX + 14, top);
      g.textBaseline = 'bottom';
      g.fillText(lo.toFixed(3), scaleX + 14, top + cell * this.rows);
    }
  }
}

// ---- the selected job -----------------------------------------------------------------

async function selectJob(jobId) {
  if (jobId === selectedJob) return;
  selectedJob = jobId;
  history.replaceState(null, '', `#job=${encodeURIComponent(jobId)}`);
  if (stream) stream.close();
  stream = null;
  charts = new Map();
  latestStep = 0;
  $('#charts').replaceChildren();
  $('#job-runs').replaceChildren();
  renderJobHeader();
  renderJobs();
  let declared = [];
  try {
    declared = (await getJson(`api/series?job=${encodeURIComponent(jobId)}`)).series;
  } catch (error) {
    $('#charts').append(el('p', { class: 'muted' }, `No telemetry: ${error.message}`));
    return;
  }
  if (jobId !== selectedJob) return;
  for (const series of declared) {
    const shape = (series.shape || []).map(Number);
    const size = shape.reduce((a, b) => a * b, 1);
    const chart = size > 1 ? new Heatmap(series.name, shape, series.caption)
      : new LineChart(series.name, [series.name]);
    charts.set(series.name, chart);
  }
  charts.set('step_time', new LineChart('step time', ['step time'], 's'));
  openStream(jobId);
}

function openStream(jobId, sinceStep = 0) {
  const query = `job=${encodeURIComponent(jobId)}&since_step=${sinceStep}`;
  const source = new EventSource(`api/watch?${query}`);
  stream = source;
  setConnection('live', 'ok');
  source.addEventListener('summary', (event) => {
    const summary = JSON.parse(event.data);
    const step = Number(summary.step);
    if (summary.rewind) {
      rewind(step, summary.rewind);
      return;
    }
    for (const value of summary.values || []) {
      const chart = charts.get(value.name);
      if (chart) chart.add(step, (value.values || []).map(Number));
    }
    charts.get('step_time')?.add(step, [Number(summary.step_time_seconds)]);
    // Achieved FLOP rate from the compiler's FLOPs per step (docs/pjrt.md); MFU on a TPU target.
    if (summary.tflops_per_device) {
      if (!charts.has('tflops')) {
        charts.set('tflops', new LineChart('TFLOP/s per device', ['TFLOP/s'], 'TFLOP/s'));
      }
      charts.get('tflops').add(step, [Number(summary.tflops_per_device)]);
    }
    if (summary.mfu) {
      if (!charts.has('mfu')) charts.set('mfu', new LineChart('MFU', ['MFU'], '%'));
      charts.get('mfu').add(step, [100 * Number(summary.mfu)]);
    }
    latestStep = Math.max(latestStep, step);
    scheduleDraw();
  });
  source.addEventListener('end', (event) => {
    const end = JSON.parse(event.data);
    source.close();
    if (end.status === 'RESOURCE_EXHAUSTED' && jobId === selectedJob) {
      // This page fell behind the live stream: resume exactly where it stopped.
      setTimeout(() => { if (jobId === selectedJob) openStream(jobId, end.resume_step); }, 500);
      return;
    }
    setConnection('job ended', 'idle');
  });
  source.onerror = () => setConnection('reconnecting…', 'warn');
  source.onopen = () => setConnection('live', 'ok');
}

// A restart (docs/checkpoints.md, "Automatic recovery"): charts drop the lost run's steps after
// the restored checkpoint, and the job header lists the run with its cause.
function rewind(step, event) {
  for (const chart of charts.values()) chart.rewind(step);
  latestStep = Math.min(latestStep, step);
  const lost = Number(event.steps_lost || 0);
  $('#job-runs').append(el('li', { 'data-attempt': String(event.attempt) },
    `run ${event.attempt}: restarted from the checkpoint of step ${step}` +
    ` (${lost} step${lost === 1 ? '' : 's'} run again)` +
    (event.host ? `; ${event.host}` : '') + (event.cause ? `: ${event.cause}` : '')));
  scheduleDraw();
}

let drawPending = false;
function scheduleDraw() {
  if (drawPending) return;
  drawPending = true;
  requestAnimationFrame(() => {
    drawPending = false;
    for (const chart of charts.values()) chart.draw();
    renderJobHeader();
  });
}

function setConnection(text, kind) {
  const pill = $('#connection');
  pill.textContent = text;
  pill.className = `pill ${kind}`;
}

function renderJobHeader() {
  const job = jobsById.get(selectedJob);
  $('#job-title').textContent =
    job ? `${job.job_id} · ${job.spec?.name || ''}` : (selectedJob || 'No job selected');
  const state = job ? short(job.state, 'JOB_STATE_') : '';
  $('#job-state').textContent = state;
  $('#job-state').className = `badge ${state}`;
  const step = Math.max(Number(job?.last_step || 0), latestStep);
  $('#job-progress').textContent = job ? `step ${step} of ${job.spec?.steps}` : '';
  const slow = job?.state === 'JOB_STATE_RUNNING' ? (job.straggler_hosts || []) : [];
  $('#job-stragglers').textContent = slow.length ? `straggler: ${slow.join(', ')}` : '';
  $('#job-stragglers').dataset.stragglers = slow.join(' ');
  $('#job-nonfinite').replaceChildren(...nonfiniteBadge(job));
  renderGoodput(job);
  const manifest = job ? JSON.stringify(job, null, 2) : '';
  if ($('#manifest').textContent !== manifest) $('#manifest').textContent = manifest;
}

// Goodput (docs/goodput.md): productive step time over wall time, and the badput by cause,
// largest first, as the coordinator computes them.
function renderGoodput(job) {
  const goodput = job?.goodput;
  const box = $('#job-goodput');
  if (!goodput || !Number(goodput.wall_seconds)) {
    box.textContent = '';
    delete box.dataset.ratio;
    return;
  }
  const ratio = Number(goodput.ratio);
  const badput = Object.entries(goodput.badput_seconds || {})
    .map(([cause, seconds]) => [cause, Number(seconds)])
    .filter(([, seconds]) => seconds >= 0.05)
    .sort((a, b) => b[1] - a[1]);
  box.dataset.ratio = ratio.toFixed(4);
  box.title = `${Number(goodput.productive_seconds).toFixed(1)} s of steps over ` +
    `${Number(goodput.wall_seconds).toFixed(1)} s wall`;
  box.replaceChildren(`goodput ${(100 * ratio).toFixed(1)}%`, ...badput.map(([cause, seconds]) =>
    el('span', { class: 'badput', 'data-cause': cause }, `${cause.replaceAll('_', ' ')} ${seconds.toFixed(1)} s`)));
}

// ---- tables ---------------------------------------------------------------------------

// Hosts the straggler detector flags now, over the running jobs: host -> [job ids].
function stragglers() {
  const byHost = new Map();
  for (const job of jobsById.values()) {
    if (job.state !== 'JOB_STATE_RUNNING') continue;
    for (const host of job.straggler_hosts || []) {
      byHost.set(host, [...(byHost.get(host) || []), job.job_id]);
    }
  }
  return byHost;
}

// A job whose loss (or another scalar series) stopped being finite: at which step, and which.
function nonfiniteBadge(job) {
  if (!Number(job?.nonfinite_step)) return [];
  const policy = short(job.spec?.on_nonfinite || 'NONFINITE_FAIL', 'NONFINITE_');
  return [el('span', {
    class: 'badge nonfinite', 'data-nonfinite-step': job.nonfinite_step,
    title: `on_nonfinite=${policy}: the job ${policy === 'fail' ? 'stopped there' : 'went on'}`,
  }, `${job.nonfinite_series} not finite at step ${job.nonfinite_step}`)];
}

function stragglerBadge(hosts, title) {
  return el('span', { class: 'badge straggler', 'data-stragglers': hosts.join(' '), title },
    `straggler: ${hosts.join(', ')}`);
}

// "data=16 (dcn 2 x ici 8) model=4": the DCN x ICI split of a multislice mesh.
function meshText(mesh) {
  return (mesh?.axis_names || []).map((axis, i) => {
    const dcn = Number(mesh.dcn_shape?.[i] || 1);
    const split = dcn > 1 ? ` (dcn ${dcn} x ici ${mesh.ici_shape?.[i]})` : '';
    return `${axis}=${mesh.shape[i]}${split}`;
  }).join(' ');
}

function renderJobs() {
  const body = $('#jobs tbody');
  const rows = [...jobsById.values()].reverse().map((job) => {
    const state = short(job.state, 'JOB_STATE_');
    let mesh = meshText(job.mesh);
    // Host replicas: each host runs the whole mesh on its own devices.
    const replicas = job.mesh?.replica_hosts || [];
    if (replicas.length > 1) mesh = `${replicas.length} hosts × (${mesh})`;
    const slow = job.state === 'JOB_STATE_RUNNING' ? (job.straggler_hosts || []) : [];
    const step = job.job_id === selectedJob
      ? Math.max(Number(job.last_step), latestStep) : job.last_step;
    const created = new Date(Number(job.created_unix_micros) / 1000).toLocaleTimeString();
    return el('tr', {
      class: job.job_id === selectedJob ? 'selected' : '',
      'data-job': job.job_id,
      onclick: () => selectJob(job.job_id),
    },
    el('td', { class: 'mono' }, job.job_id),
    el('td', {}, job.spec?.name || ''),
    el('td', {}, el('span', { class: `badge ${state}` }, state), ...nonfiniteBadge(job),
      ...(slow.length ? [stragglerBadge(slow, 'hosts slower than their peers in this job')] : [])),
    el('td', { class: 'num' }, `${step} / ${job.spec?.steps}`),
    el('td', { class: 'mono' }, mesh),
    el('td', { class: 'muted' }, created));
  });
  body.replaceChildren(...(rows.length ? rows : [emptyRow(6, 'no jobs yet')]));
}

async function refreshJobs() {
  try {
    const { jobs = [] } = await getJson('api/jobs');
    jobsById = new Map(jobs.map((job) => [job.job_id, job]));
    renderJobs();
    if (!selectedJob && jobs.length) {
      const wanted = new URLSearchParams(location.hash.slice(1)).get('job');
      const running = jobs.filter((job) => job.state === 'JOB_STATE_RUNNING');
      const pick = jobsById.has(wanted) ? wanted : (running.at(-1) || jobs.at(-1)).job_id;
      selectJob(pick);
    }
    renderJobHeader();
  } catch (error) {
    setConnection('coordinator unreachable', 'warn');
  }
}

const memory = new Map();  // host -> text
async function refreshMemory(host) {
  try {
    const { devices = [] } = await getJson(`api/memory?host=${encodeURIComponent(host)}`);
    const used = devices.reduce((sum, d) => sum + Number(d.bytes_in_use || 0), 0);
    const reported = devices.filter((d) => d.bytes_in_use !== undefined);
    memory.set(host, reported.length
      ? `${formatBytes(used)} on ${reported.length} devices`
      : (devices[0]?.unreported_reason ? 'not reported by runtime' : ''));
  } catch (error) {
    memory.set(host, '');
  }
}

// The workers table shows a page of the registry at a time (a fleet of a thousand hosts is
// 1.4 MB in one answer); the slice summary above it counts every worker. #workers_page=N in the
// address sets the page size.
const workersPageSize = Number(new URLSearchParams(location.hash.slice(1)).get('workers_page')) || 50;
const workerPages = [''];  // the page token of each page up to the one shown ('' = the first)

function renderWorkerSlices(slices) {
  const count = (key) => slices.reduce((sum, s) => sum + Number(s[key] || 0), 0);
  const rows = slices.length > 1 ? slices.map((s) => el('tr', { 'data-slice': String(s.slice_id || 0) },
    el('td', {}, `slice ${s.slice_id || 0}`), el('td', { class: 'num' }, String(s.alive || 0)),
    el('td', { class: 'num' }, String(s.dead || 0)), el('td', { class: 'num' }, String(s.left || 0)),
    el('td', { class: 'num' }, String(s.alive_devices || 0)))) : [];
  const total = el('tr', { 'data-slice': 'all' },
    el('td', {}, 'all'), el('td', { class: 'num' }, String(count('alive'))),
    el('td', { class: 'num' }, String(count('dead'))), el('td', { class: 'num' }, String(count('left'))),
    el('td', { class: 'num' }, String(count('alive_devices'))));
  $('#worker-slices tbody').replaceChildren(...rows, total);
}

function renderWorkerPager(shown, total, next) {
  const first = (workerPages.length - 1) * workersPageSize;
  $('#workers-range').textContent = shown ? `${first + 1}–${first + shown} of ${total}` : `0 of ${total}`;
  $('#workers-prev').disabled = workerPages.length < 2;
  $('#workers-next').disabled = !next;
  $('#workers-next').dataset.token = next;
}

async function refreshWorkers() {
  try {
    const token = workerPages.at(-1);
    const query = `api/workers?page_size=${workersPageSize}${token ? `&page_token=${encodeURIComponent(token)}` : ''}`;
    const { workers = [], slices = [], total_matches: total = 0, next_page_token: next = '' } = await getJson(query);
    const ask = workers.filter((w) => w.state === 'WORKER_STATE_ALIVE' && !memory.has(w.registration.host));
    await Promise.all(ask.map((w) => refreshMemory(w.registration.host)));
    const slow = stragglers();
    const rows = workers.map((worker) => {
      const state = short(worker.state, 'WORKER_STATE_');
      const host = worker.registration.host;
      const slices = Number(worker.registration.num_slices || 1);
      const jobs = slow.get(host) || [];
      return el('tr', { 'data-host': host, ...(jobs.length ? { 'data-straggler': jobs.join(' ') } : {}) },
        el('td', { class: 'mono' }, host,
          ...(slices > 1 ? [el('span', { class: 'muted slice' }, `slice ${worker.registration.slice_id || 0}`)] : []),
          ...(jobs.length ? [el('span', { class: 'badge straggler', title: `straggler in ${jobs.join(', ')}` }, 'straggler')] : [])),
        el('td', {}, el('span', { class: `badge ${state}`, title: worker.state_reason }, state)),
        el('td', { class: 'muted' }, ago(worker.last_heartbeat_unix_micros)),
        el('td', { class: 'num' }, String((worker.registration.devices || []).length)),
        el('td', { class: 'muted' }, memory.get(host) || ''));
    });
    $('#workers tbody').replaceChildren(...(rows.length ? rows : [emptyRow(5, 'no workers registered')]));
    renderWorkerSlices(slices);
    renderWorkerPager(workers.length, Number(total), next);
  } catch (error) {
    setConnection('coordinator unreachable', 'warn');
  }
}

$('#workers-next').addEventListener('click', () => {
  const next = $('#workers-next').dataset.token;
  if (next) workerPages.push(next);
  refreshWorkers();
});
$('#workers-prev').addEventListener('click', () => {
  if (workerPages.length > 1) workerPages.pop();
  refreshWorkers();
});

refreshJobs();
refreshWorkers();
setInterval(refreshJobs, 2000);
setInterval(refreshWorkers, 3000);
setInterval(() => memory.clear(), 15000);
