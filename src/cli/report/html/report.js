// oomshim HTML report. Vanilla JS, no libraries, no network. Every string from the dump is
// untrusted: it reaches the page only through textContent, setAttribute or createTextNode.
(function () {
  'use strict';
  var T0 = performance.now();
  var SELFTEST = location.hash === '#selftest';
  var errors = [];
  window.addEventListener('error', function (e) {
    errors.push('error: ' + (e && e.message ? e.message : String(e)));
  });
  window.addEventListener('unhandledrejection', function (e) {
    errors.push('unhandled rejection: ' + String(e && e.reason));
  });
  var consoleError = console.error;
  console.error = function () {
    errors.push('console.error: ' + Array.prototype.map.call(arguments, String).join(' '));
    return consoleError.apply(console, arguments);
  };

  // ---- helpers -------------------------------------------------------------------------------

  function el(tag, attrs) {
    var e = document.createElement(tag);
    if (attrs) {
      for (var k in attrs) {
        if (!Object.prototype.hasOwnProperty.call(attrs, k) || attrs[k] == null) continue;
        if (k === 'text') e.textContent = attrs[k];
        else if (k === 'class') e.className = attrs[k];
        else e.setAttribute(k, attrs[k]);
      }
    }
    for (var i = 2; i < arguments.length; i++) add(e, arguments[i]);
    return e;
  }
  // Appends each further argument: a node, text, an array of them; null/false are skipped.
  function add(parent) {
    for (var i = 1; i < arguments.length; i++) {
      var child = arguments[i];
      if (child == null || child === false) continue;
      if (Array.isArray(child)) { child.forEach(function (c) { add(parent, c); }); continue; }
      parent.appendChild(typeof child === 'object' ? child : document.createTextNode(String(child)));
    }
  }
  function byId(id) { return document.getElementById(id); }
  // The verdict's sentences mark code with Markdown backticks (`expandable_segments:True`): each
  // span becomes a <code> element (its text through textContent), the backticks disappear.
  function rich(text) {
    var parts = String(text).split('`');
    if (parts.length % 2 === 0) return [String(text)]; // unbalanced: keep it as it is
    return parts.map(function (p, i) { return i % 2 ? el('code', { text: p }) : p; }).filter(function (p) { return p !== ''; });
  }
  function richEl(tag, attrs, text) { return el(tag, attrs, rich(text)); }

  var UNITS = ['KiB', 'MiB', 'GiB', 'TiB', 'PiB', 'EiB'];
  // Same as units::human_bytes: binary units, two decimals, never 1024.00 of a unit.
  function humanBytes(b) {
    if (b == null) return 'n/a';
    if (b < 1024) return String(b) + ' B';
    var v = b / 1024, u = 0;
    while (u + 1 < UNITS.length && Math.round(v * 100) >= 102400) { v /= 1024; u++; }
    return v.toFixed(2) + ' ' + UNITS[u];
  }
  // Axis ticks at round steps: 1, 2, 2.5 or 5 × 10^k of the binary unit the top is shown in
  // (an 8 GiB top: 0, 2, 4, 6, 8 GiB), at most `intervals` + 1 of them, none above `top`.
  function roundTicks(top, intervals) {
    if (!(top > 0)) return { step: 1, ticks: [0] };
    var unit = 1;
    while (unit * 1024 <= top && unit < Math.pow(1024, 6)) unit *= 1024;
    var raw = top / unit / intervals, p = Math.pow(10, Math.floor(Math.log10(raw)));
    var m = [1, 2, 2.5, 5, 10].filter(function (x) { return x * p >= raw * (1 - 1e-9); })[0];
    var step = Math.max(m * p * unit, 1), ticks = [];
    for (var i = 0; i * step <= top * (1 + 1e-9); i++) ticks.push(i * step);
    return { step: step, ticks: ticks };
  }
  // '1 allocation', '2 allocations': a count with the word that agrees with it.
  function plural(n, one, many) { return thousands(n) + ' ' + (n === 1 ? one : many); }
  function thousands(n) {
    if (n == null) return 'n/a';
    var s = String(Math.round(n)), out = '';
    for (var i = 0; i < s.length; i++) {
      if (i > 0 && (s.length - i) % 3 === 0) out += ',';
      out += s[i];
    }
    return out;
  }
  function exact(b) { return b < 1024 ? humanBytes(b) : humanBytes(b) + ' (' + thousands(b) + ' bytes)'; }
  function percent(part, whole) {
    if (!whole) return 'n/a';
    var p = part * 100 / whole;
    return isFinite(p) ? p.toFixed(1) + '%' : 'n/a';
  }
  function humanAge(s) {
    if (s == null || !isFinite(s) || s < 0) return '?';
    if (s < 1) return (s * 1000).toFixed(0) + ' ms';
    if (s < 60) return s.toFixed(1) + ' s';
    if (s < 3600) return (s / 60).toFixed(1) + ' min';
    if (s < 86400) return (s / 3600).toFixed(1) + ' h';
    return (s / 86400).toFixed(1) + ' d';
  }
  function shellQuote(a) {
    return /^[A-Za-z0-9_\-.,:\/=+@%]+$/.test(a) ? a : '"' + a.replace(/(["\\$`])/g, '\\$1') + '"';
  }
  // Runs one section's renderer; a failure shows in that section and is recorded, the rest renders.
  function section(id, fn) {
    var s = byId(id);
    try { fn(s); } catch (err) {
      console.error('rendering #' + id + ' failed: ' + (err && err.stack ? err.stack : err));
      add(s, el('div', { class: 'error-box', text: 'This section could not be rendered: ' + err }));
    }
  }

  // ---- data ----------------------------------------------------------------------------------

  var D = JSON.parse(byId('oomshim-data').textContent);
  var FR = D.frames, ST = D.stacks;
  var HC = {}, SC = {};
  D.holder_columns.forEach(function (c, i) { HC[c] = i; });
  D.site_columns.forEach(function (c, i) { SC[c] = i; });
  var trackedTotal = D.devices.reduce(function (a, d) { return a + d.tracked_bytes; }, 0);
  // The verdict's texts name files as the dump has them: shown from the program's source root.
  var SAID_ELSEWHERE = new Set(D.said_elsewhere || []);
  function fresh(e) { return !SAID_ELSEWHERE.has(e); }
  function shown(text) {
    var root = D.source_root;
    return root && root.length > 1 && text ? text.split(root).join('') : text;
  }

  // The frames the text report names (report::named_frames): with Python frames only those;
  // only frames with a function name; CUDA API/runtime frames only when nothing else is left.
  var namedCache = new Map();
  function namedFrames(si) {
    var got = namedCache.get(si);
    if (got) return got;
    var stack = ST[si];
    var py = stack.some(function (i) { return FR[i].k === 'py'; });
    var named = stack.filter(function (i) { return (!py || FR[i].k === 'py') && FR[i].n; });
    var hasCaller = named.some(function (i) { return !FR[i].a; });
    got = hasCaller ? named.filter(function (i) { return !FR[i].a; }) : named;
    // The C runtime's start-up frames (libc, ld.so, _start) only when nothing else names it.
    var own = got.filter(function (i) { return !FR[i].y; });
    if (own.length) got = own;
    namedCache.set(si, got);
    return got;
  }
  function topLabel(si) {
    var n = namedFrames(si);
    return n.length ? FR[n[0]].l : '';
  }
  function kindTag(f) { return el('span', { class: 'kind ' + f.k, text: f.k === 'py' ? 'PY' : 'C' }); }

  // The first named frames of a stack, and the whole stack behind a <details> built on demand.
  function stackCell(si, shown) {
    var wrap = el('div', { class: 'frames' });
    var n = namedFrames(si);
    if (!n.length) add(wrap, el('div', { class: 'muted', text: ST[si].length ? '(no named frames)' : '(no stack)' }));
    n.slice(0, shown).forEach(function (i) { add(wrap, el('div', { title: FR[i].l }, kindTag(FR[i]), FR[i].l)); });
    if (ST[si].length) {
      var det = el('details', { class: 'stack' }, el('summary', { text: 'all ' + ST[si].length + ' frames' }));
      det.addEventListener('toggle', function () {
        if (!det.open || det.querySelector('ol')) return;
        var keep = new Set(n);
        add(det, el('ol', null, ST[si].map(function (i) {
          var f = FR[i];
          return el('li', { class: f.y ? 'dim sys' : keep.has(i) ? null : 'dim', title: f.file ? f.file + ' ' + f.addr : f.addr },
            kindTag(f), f.l, f.i ? ' (inlined)' : '', f.y ? ' (system)' : '');
        })));
      });
      add(wrap, det);
    }
    return wrap;
  }

  // ---- header --------------------------------------------------------------------------------

  // The verdict is the headline and the title; what happened is the line above it.
  section('top', function () {
    var p = D.process;
    byId('occasion').textContent = D.occasion;
    var h = byId('headline');
    add(h, el('span', { id: 'headline-kind', class: 'badge ' + (D.failed_request ? 'oom' : 'snap'), text: D.verdict.kind }), ' ', rich(shown(D.headline)));
    document.title = D.verdict.kind + ': ' + shown(D.headline).replace(/`/g, '') + ' - oomshim';
    var meta = byId('meta');
    var who = 'pid ' + p.pid + ' on ' + p.host;
    if (p.rank != null) who += ', rank ' + p.rank;
    if (p.local_rank != null) who += ' / local rank ' + p.local_rank;
    if (p.world_size != null) who += ', world size ' + p.world_size;
    add(meta, el('span', { text: D.time }));
    add(meta, el('span', { text: who }));
    if (p.command_line.length) add(meta, el('span', null, 'command ', el('code', { text: p.command_line.map(shellQuote).join(' ') })));
  });

  // ---- the answer: what fills the device, the change to make --------------------------------

  var FILL_COLOURS = {
    this_process: 'var(--own)', untracked: 'var(--untracked)', framework_cache: '#8fb8e8',
    other_processes: 'var(--accent)', free: 'var(--free)'
  };
  section('answer', function (s) {
    var f = D.fill, r = D.failed_request;
    if (r) {
      var n = namedFrames(r.stack).slice(0, 2).map(function (i) { return FR[i].l; });
      if (n.length) add(s, el('p', { id: 'failing-line', class: 'muted' }, 'Failed at ', el('code', { text: n.join(' ← ') })));
    }
    if (f && f.rows.length) {
      add(s, el('h2', { text: 'What fills device ' + f.device + ' (' + humanBytes(f.total_bytes) + ')' + (f.by_kind ? ', by kind' : '') }));
      var bar = el('div', { id: 'fill', class: 'usage big' });
      var legend = el('div', { id: 'fill-legend', class: 'legend' });
      f.rows.forEach(function (row, i) {
        var colour = FILL_COLOURS[row.key] || 'hsl(' + ((i * 47 + 200) % 360) + ', 60%, 55%)';
        var w = row.bytes * 100 / f.total_bytes;
        add(bar, el('div', { title: row.label + ': ' + exact(row.bytes), style: 'background:' + colour + ';width:' + w.toFixed(3) + '%' }));
        add(legend, el('span', { style: '--c: ' + colour, text: row.label + ' ' + humanBytes(row.bytes) + ' (' + percent(row.bytes, f.total_bytes) + ')' }));
      });
      add(s, bar, legend);
    } else {
      add(s, el('h2', { text: 'What fills the device' }), el('p', { class: 'muted', text: 'Not known: the dump has no total and free bytes for the device.' }));
    }
    if (D.change) add(s, el('h3', { text: 'The change to make' }), richEl('p', { id: 'change' }, shown(D.change)));
    add(s, el('p', { class: 'muted', text: 'Why, the evidence, every stack and table follow below.' }));
  });

  // ---- verdict -------------------------------------------------------------------------------

  section('verdict', function (s) {
    var v = D.verdict;
    if (!D.failed_request) s.classList.add('snapshot');
    add(s, el('h2', null, 'Why', el('span', { id: 'verdict-kind', class: 'badge ' + (D.failed_request ? 'oom' : 'snap'), text: v.kind })));
    add(s, richEl('p', { id: 'verdict-summary' }, shown(v.summary)));
    // The ranked findings, top first, each with the bytes it explains and its own evidence.
    if (v.findings && v.findings.length > 1) {
      add(s, el('h3', { text: 'Findings (by bytes explained)' }), el('ol', { id: 'verdict-findings' }, v.findings.map(function (f) {
        var li = el('li', null, el('span', { class: 'badge', text: f.kind }), ' ', el('b', { text: humanBytes(f.bytes) }), ': ', rich(shown(f.headline)));
        var ev = (f.evidence || []).filter(fresh);
        if (ev.length) add(li, el('ul', null, ev.map(function (e) { return richEl('li', null, shown(e)); })));
        return li;
      })));
    }
    var evidence = v.evidence.filter(fresh);
    if (evidence.length) add(s, el('h3', { text: 'Evidence' }), el('ul', { id: 'verdict-evidence' }, evidence.map(function (e) { return richEl('li', null, shown(e)); })));
    // The first suggestion is the answer's change; the others are here.
    var more = v.suggestions.filter(function (t) { return t !== D.change; });
    if (more.length) add(s, el('h3', { text: D.change ? 'Other suggestions' : 'Suggestions' }), el('ul', { id: 'verdict-suggestions' }, more.map(function (e) { return richEl('li', null, shown(e)); })));
    if (D.recorded_verdict_kind && D.recorded_verdict_kind !== v.kind) {
      add(s, el('p', { class: 'muted', text: 'The dump recorded the verdict "' + D.recorded_verdict_kind + '"; this report judges it with the current rules.' }));
    }
  });

  // ---- failed request ------------------------------------------------------------------------

  var OUTCOME = {
    recovered: 'recovered: a retry succeeded; the program did not see this error',
    stood: 'stood: no retry succeeded; the program saw this error',
    unknown: 'unknown: the dump was written before a retry could succeed'
  };
  section('failed', function (s) {
    var r = D.failed_request;
    add(s, el('h2', { text: 'Failed request' }));
    if (!r) { add(s, el('p', { class: 'muted', text: 'None: this dump was requested (reason: ' + D.reason + '), not written for an out-of-memory failure.' })); return; }
    var dl = el('dl', { class: 'kv' });
    function row(k, v) { add(dl, el('dt', { text: k }), el('dd', null, v)); }
    row('size', el('span', { id: 'failed-size', class: 'mono', text: exact(r.bytes) }));
    row('call', r.api + ' on device ' + r.device + ', error ' + r.error_code);
    row('outcome', OUTCOME[r.recovery] || r.recovery);
    row('burst', plural(r.failures_in_burst, 'failure', 'failures'));
    var lf = r.last_failure;
    if (lf) row('last', humanBytes(lf.bytes) + ' via ' + lf.api + ', ' + humanBytes(lf.free_bytes) + ' free of ' + humanBytes(lf.total_bytes) + ', ' + humanBytes(lf.tracked_bytes) + ' tracked');
    row('stack', stackCell(r.stack, 6));
    add(s, dl);
  });

  // ---- devices -------------------------------------------------------------------------------

  section('devices', function (s) {
    add(s, el('h2', { text: 'Devices' }));
    if (!D.devices.length) { add(s, el('p', { class: 'muted', text: 'No devices in this dump.' })); return; }
    var cols = ['dev', 'name', 'total', 'free', 'used', 'tracked', 'allocs', 'peak', 'tracked % of used'];
    var num = { dev: 1, total: 1, free: 1, used: 1, tracked: 1, allocs: 1, peak: 1, 'tracked % of used': 1 };
    var tb = el('tbody');
    D.devices.forEach(function (d) {
      add(tb, el('tr', null,
        el('td', { class: 'num', text: d.index }),
        el('td', { text: d.name == null ? '?' : d.name }),
        el('td', { class: 'num', text: humanBytes(d.total_bytes) }),
        el('td', { class: 'num', text: humanBytes(d.free_bytes) }),
        el('td', { class: 'num', text: humanBytes(d.used_bytes) }),
        el('td', { class: 'num', text: humanBytes(d.tracked_bytes) }),
        el('td', { class: 'num', text: thousands(d.tracked_count) }),
        el('td', { class: 'num', text: humanBytes(d.peak_tracked_bytes) }),
        el('td', { class: 'num', text: d.used_bytes == null ? 'n/a' : percent(d.tracked_bytes, d.used_bytes) })));
    });
    add(s, el('table', null, el('thead', null, el('tr', null, cols.map(function (c) { return el('th', { class: num[c] ? 'num' : null, text: c }); }))), tb));
    var ph = D.pinned_host;
    add(s, el('p', { class: 'muted', text: 'Pinned host memory: ' + humanBytes(ph.bytes) + ' in ' + plural(ph.count, 'allocation', 'allocations') + ' (peak ' + humanBytes(ph.peak_bytes) + '); host memory, not counted as device memory.' }));
  });

  // ---- growth chart --------------------------------------------------------------------------

  // SVG's namespace, from the parser itself (the page names no URL, not even a namespace's).
  var SVG = new DOMParser().parseFromString('<svg></svg>', 'text/html').body.firstChild.namespaceURI;
  function svg(tag, attrs) {
    var e = document.createElementNS(SVG, tag);
    for (var k in attrs) if (Object.prototype.hasOwnProperty.call(attrs, k) && attrs[k] != null) {
      if (k === 'text') e.textContent = attrs[k]; else e.setAttribute(k, attrs[k]);
    }
    return e;
  }
  // Tracked bytes at each sample, the top growing site's fitted line drawn through the last sample
  // out to the step where free memory runs out, and the device's capacity.
  var growthChart = null;
  section('growth', function (s) {
    var g = D.growth;
    var unit = g && g.unit === 'second' ? 'second' : 'step';
    add(s, el('h2', { text: 'Tracked bytes per ' + unit }));
    if (!g || g.tracked.length < 2) {
      add(s, el('p', { class: 'muted', id: 'growth-none', text: 'No growth history in this dump: it needs two samples (a step mark with oomshim.step() / oomshim_step(), a detected step, or one sample per second).' }));
      // Without a chart the section is no part of the answer: it goes after the verdict.
      var why = byId('verdict');
      if (why && why.parentNode) why.parentNode.insertBefore(s, why.nextSibling);
      return;
    }
    var pts = g.tracked, site = g.sites.length ? g.sites[0] : null;
    var last = pts[pts.length - 1];
    var x0 = pts[0][0], x1 = last[0];
    var fitEnd = null;
    if (site) {
      // Out to the projected step, within four times the sampled span (a far projection would
      // squash the samples into a corner).
      var end = site.projected_oom_step != null ? site.projected_oom_step : (g.projected_oom_step != null ? g.projected_oom_step : x1);
      end = Math.min(Math.max(end, x1), x1 + 4 * Math.max(1, x1 - x0));
      var fitStart = Math.max(x0, Math.min(site.first[0], x1));
      fitEnd = end;
      x1 = Math.max(x1, end);
    }
    var fitY = function (x) { return last[1] + site.bytes_per_step * (x - last[0]); };
    var ymax = pts.reduce(function (m, p) { return Math.max(m, p[1]); }, 0);
    if (g.capacity_bytes) ymax = Math.max(ymax, g.capacity_bytes);
    if (site) ymax = Math.max(ymax, Math.min(fitY(fitEnd), (g.capacity_bytes || fitY(fitEnd)) * 1.2));
    ymax = ymax * 1.05 || 1;
    if (x1 === x0) x1 = x0 + 1;
    var W = 800, H = 260, L = 78, R = 16, TOP = 12, B = 34;
    var X = function (x) { return L + (x - x0) * (W - L - R) / (x1 - x0); };
    var Y = function (y) { return TOP + (H - TOP - B) * (1 - Math.min(y, ymax) / ymax); };
    var chart = svg('svg', { id: 'growth-chart', viewBox: '0 0 ' + W + ' ' + H, role: 'img', 'aria-label': 'tracked bytes per ' + unit });
    var axes = svg('g', { class: 'axes' });
    // Round byte ticks (0, 2, 4, 6, 8 GiB), none above the device's capacity.
    var yTicks = roundTicks(g.capacity_bytes ? Math.min(ymax, g.capacity_bytes) : ymax, 4);
    yTicks.ticks.forEach(function (yv) {
      var yy = Y(yv);
      axes.appendChild(svg('line', { x1: L, x2: W - R, y1: yy, y2: yy, class: 'grid' }));
      axes.appendChild(svg('text', { x: L - 6, y: yy + 4, 'text-anchor': 'end', class: 'y-tick', text: humanBytes(yv) }));
    });
    for (var i = 0; i <= 4; i++) {
      var xv = Math.round(x0 + (x1 - x0) * i / 4);
      axes.appendChild(svg('text', { x: X(xv), y: H - B + 16, 'text-anchor': 'middle', text: String(xv) }));
    }
    axes.appendChild(svg('text', { x: (L + W - R) / 2, y: H - 4, 'text-anchor': 'middle', text: unit === 'step' ? 'step' : 'seconds since start' }));
    chart.appendChild(axes);
    if (g.capacity_bytes) {
      var cy = Y(g.capacity_bytes);
      chart.appendChild(svg('line', { id: 'growth-capacity', x1: L, x2: W - R, y1: cy, y2: cy, class: 'capacity' }));
      chart.appendChild(svg('text', { x: W - R - 4, y: cy - 5, 'text-anchor': 'end', class: 'capacity-label', text: 'device capacity ' + humanBytes(g.capacity_bytes) }));
    }
    if (site) {
      chart.appendChild(svg('line', { id: 'growth-fit', x1: X(fitStart), y1: Y(fitY(fitStart)), x2: X(fitEnd), y2: Y(fitY(fitEnd)), class: 'fit' }));
    }
    var line = svg('polyline', { id: 'growth-tracked', class: 'tracked', points: pts.map(function (p) { return X(p[0]).toFixed(1) + ',' + Y(p[1]).toFixed(1); }).join(' ') });
    chart.appendChild(line);
    pts.forEach(function (p) {
      chart.appendChild(svg('circle', { cx: X(p[0]), cy: Y(p[1]), r: 2.2, class: 'dot' })).appendChild(svg('title', { text: unit + ' ' + p[0] + ': ' + exact(p[1]) }));
    });
    add(s, el('div', { class: 'chart-wrap' }, chart));
    var legend = el('div', { class: 'legend' },
      el('span', { style: '--c: var(--own)', text: 'tracked device bytes (' + plural(pts.length, 'sample', 'samples') + (g.steps ? ', ' + g.steps + ' steps' : '') + ')' }),
      site ? el('span', { style: '--c: var(--fit)', text: 'fitted growth of the top site' }) : null,
      g.capacity_bytes ? el('span', { style: '--c: var(--capacity)', text: 'device capacity' }) : null);
    add(s, legend);
    if (site) {
      var label = topLabel(site.stack) || '(no named frame)';
      var r2 = site.r_squared == null ? '' : ' (R² ' + site.r_squared.toFixed(3) + ' over ' + plural(site.samples, 'sample', 'samples') + ')';
      var out = site.projected_oom_step != null ? '; at that rate free memory runs out at ' + unit + ' ' + thousands(site.projected_oom_step) : '';
      add(s, el('p', { id: 'growth-caption' }, unit === 'step' ? 'Fitted leak: ' : 'Growth per second (evidence only: loading also grows steadily): ',
        el('code', { text: label }), ' +' + humanBytes(site.bytes_per_step) + ' per ' + unit + r2 + out + '.'));
    } else {
      add(s, el('p', { class: 'muted', id: 'growth-caption', text: 'No site grows steadily (a fit needs a positive slope with R² ≥ 0.9 over at least 4 samples).' }));
    }
    growthChart = { svg: chart, line: line, points: pts.length, fit: site != null, capacity: !!g.capacity_bytes, yTicks: yTicks };
  });

  // ---- flame (icicle) graph ------------------------------------------------------------------

  // Boxes narrower than MIN_PX are not drawn (counted in the info line); at most MAX_BOXES are.
  var ROW = 20, MIN_PX = 3, MAX_BOXES = 4000;
  var flame = { source: null, all: true, sys: false, root: null, zoom: null, boxes: [] };

  function buildTree(source, all) {
    var rows = source === 'sites' ? D.sites : D.holders;
    var bi = 0, ci = source === 'sites' ? SC.count : -1, si = source === 'sites' ? SC.stack : HC.stack;
    var root = { f: -1, v: 0, n: 0, ch: new Map(), parent: null, depth: 0 };
    for (var r = 0; r < rows.length; r++) {
      var row = rows[r], b = row[bi], c = ci < 0 ? 1 : row[ci];
      var frames = all ? ST[row[si]] : namedFrames(row[si]);
      // System frames (libc, ld.so, _start) are folded away unless asked for, where others
      // are left.
      if (!flame.sys) {
        var own = frames.filter(function (i) { return !FR[i].y; });
        if (own.length) frames = own;
      }
      var node = root;
      root.v += b; root.n += c;
      for (var i = frames.length - 1; i >= 0; i--) {
        var f = frames[i], child = node.ch.get(f);
        if (!child) { child = { f: f, v: 0, n: 0, ch: new Map(), parent: node, depth: node.depth + 1 }; node.ch.set(f, child); }
        child.v += b; child.n += c;
        node = child;
      }
    }
    return root;
  }
  function nodeLabel(n, full) {
    if (n.f < 0) return 'all (' + (flame.source === 'sites' ? 'allocation sites' : 'largest holders') + ')';
    return full ? FR[n.f].l : FR[n.f].s;
  }
  function nodeClass(n) {
    if (n.f < 0) return 'root';
    var f = FR[n.f];
    if (f.y) return 'sys';
    if (f.a) return 'cuda';
    if (!f.n) return 'unnamed';
    return f.k;
  }
  function nodeInfo(n) {
    var total = flame.root.v;
    var unit = flame.source === 'sites' ? ' allocations' : ' holders';
    return nodeLabel(n, true) + ': ' + humanBytes(n.v) + ' (' + percent(n.v, total) + ' of all shown, ' + thousands(n.n) + unit + ')';
  }
  function childrenBySize(n) {
    return Array.from(n.ch.values()).sort(function (a, b) { return b.v - a.v || a.f - b.f; });
  }

  function renderFlame() {
    var graph = byId('flame-graph'), crumbs = byId('flame-crumbs');
    graph.textContent = '';
    crumbs.textContent = '';
    flame.boxes = [];
    var path = [];
    for (var a = flame.zoom; a; a = a.parent) path.unshift(a);
    path.forEach(function (p, i) {
      if (i) add(crumbs, el('span', { class: 'sep', text: '›' }));
      var link = el('a', { 'data-depth': String(p.depth), title: nodeLabel(p, true), text: i ? FR[p.f].s : 'all' });
      link.addEventListener('click', function () { zoomTo(p); });
      add(crumbs, link);
    });
    var frag = document.createDocumentFragment();
    var maxDepth = 0, skipped = 0;
    var minFraction = MIN_PX / Math.max(graph.clientWidth || 0, 300);
    function box(n, left, width, anc) {
      var b = el('div', {
        class: 'fl ' + nodeClass(n) + (anc ? ' anc' : ''),
        'data-i': String(flame.boxes.length),
        title: nodeInfo(n),
        style: 'left:' + (left * 100).toFixed(4) + '%;width:' + (width * 100).toFixed(4) + '%;top:' + (n.depth * ROW) + 'px',
        text: nodeLabel(n, false)
      });
      flame.boxes.push(n);
      frag.appendChild(b);
      if (n.depth > maxDepth) maxDepth = n.depth;
    }
    path.slice(0, -1).forEach(function (p) { box(p, 0, 1, true); });
    var z = flame.zoom;
    var queue = [[z, 0, 1]];
    while (queue.length) {
      var item = queue.shift(), n = item[0], left = item[1], width = item[2];
      if (flame.boxes.length >= MAX_BOXES) { skipped++; continue; }
      box(n, left, width, false);
      var x = left;
      childrenBySize(n).forEach(function (c) {
        var w = z.v > 0 ? width * c.v / n.v : 0;
        if (!(w >= minFraction)) { skipped++; return; }
        queue.push([c, x, w]);
        x += w;
      });
    }
    graph.appendChild(frag);
    graph.style.height = ((maxDepth + 1) * ROW + 2) + 'px';
    byId('flame-info').textContent = (z.f < 0 ? 'Click a box to zoom into it; click the top box or "all" to go back.' : 'Zoomed: ' + nodeInfo(z)) +
      (skipped ? ' (' + thousands(skipped) + ' boxes too narrow to draw)' : '');
  }
  function zoomTo(n) { flame.zoom = n; renderFlame(); }
  function rebuildFlame() {
    flame.root = buildTree(flame.source, flame.all);
    flame.zoom = flame.root;
    renderFlame();
  }

  section('flame', function (s) {
    add(s, el('h2', { text: 'Live bytes by stack' }));
    if (!D.sites.length && !D.holders.length) { add(s, el('p', { class: 'muted', text: 'No live allocations listed in this dump.' })); return; }
    // Sites are all of the live bytes by stack; holders only the largest allocations.
    flame.source = D.sites.length ? 'sites' : 'holders';
    var controls = el('div', { class: 'controls' });
    ['sites', 'holders'].forEach(function (src) {
      var input = el('input', { type: 'radio', name: 'flame-source', value: src, id: 'flame-src-' + src });
      input.checked = flame.source === src;
      input.disabled = src === 'sites' ? !D.sites.length : !D.holders.length;
      input.addEventListener('change', function () { if (input.checked) { flame.source = src; rebuildFlame(); } });
      add(controls, el('label', null, input, ' ', src === 'sites' ? 'allocation sites (' + thousands(D.sites.length) + ')' : 'largest holders (' + thousands(D.holders.length) + ')'));
    });
    var allBox = el('input', { type: 'checkbox', id: 'flame-all' });
    allBox.checked = flame.all;
    allBox.addEventListener('change', function () { flame.all = allBox.checked; rebuildFlame(); });
    add(controls, el('label', { title: 'Unchecked: only the frames the text report names (Python frames when the stack has them; no CUDA runtime frames)' }, allBox, ' all frames (Python and native)'));
    var sysBox = el('input', { type: 'checkbox', id: 'flame-sys' });
    sysBox.checked = flame.sys;
    sysBox.addEventListener('change', function () { flame.sys = sysBox.checked; rebuildFlame(); });
    add(controls, el('label', { title: 'The C runtime and loader frames every native stack starts with' }, sysBox, ' system frames (libc, ld.so, _start)'));
    var reset = el('button', { type: 'button', text: 'Reset zoom' });
    reset.addEventListener('click', function () { zoomTo(flame.root); });
    add(controls, reset);
    add(s, controls);
    add(s, el('div', { class: 'legend' },
      el('span', { style: '--c: var(--py)', text: 'Python' }),
      el('span', { style: '--c: var(--native)', text: 'native' }),
      el('span', { style: '--c: var(--cuda)', text: 'CUDA runtime / allocator / shim' }),
      el('span', { style: '--c: var(--sys)', text: 'system (libc, ld.so, _start; folded unless shown)' }),
      el('span', { style: '--c: var(--unnamed)', text: 'no symbol' }),
      el('span', { class: 'muted', text: 'outermost caller at the top, the allocating frame at the leaf; width = live bytes' })));
    add(s, el('div', { id: 'flame-crumbs' }));
    add(s, el('div', { id: 'flame-info' }));
    var graph = el('div', { id: 'flame-graph' });
    graph.addEventListener('click', function (e) {
      var t = e.target.closest ? e.target.closest('.fl') : null;
      if (!t) return;
      var n = flame.boxes[+t.getAttribute('data-i')];
      if (!n) return;
      zoomTo(n === flame.zoom && n.parent ? n.parent : n);
    });
    graph.addEventListener('mouseover', function (e) {
      var t = e.target.closest ? e.target.closest('.fl') : null;
      if (t) byId('flame-info').textContent = nodeInfo(flame.boxes[+t.getAttribute('data-i')]);
    });
    add(s, graph);
    rebuildFlame();
  });

  // ---- sortable tables -----------------------------------------------------------------------

  var PAGE = 500;
  // columns: {label, key(row) for sorting, cell(row, rank) -> td, num, desc (first click order)}
  function sortableTable(s, id, rows, columns, initial) {
    var state = { col: initial, desc: columns[initial].desc, order: null, shown: 0 };
    var thead = el('tr');
    var ths = columns.map(function (c, ci) {
      var th = el('th', { class: (c.num ? 'num ' : '') + (c.key ? 'sortable' : ''), 'data-col': c.label, scope: 'col' });
      if (c.key) {
        th.setAttribute('tabindex', '0');
        th.addEventListener('click', function () { sortBy(ci); });
        th.addEventListener('keydown', function (e) { if (e.key === 'Enter' || e.key === ' ') { e.preventDefault(); sortBy(ci); } });
      }
      add(th, el('span', { text: c.label }), el('span', { class: 'arrow' }));
      add(thead, th);
      return th;
    });
    var tbody = el('tbody');
    var foot = el('div', { class: 'table-foot' });
    var status = el('span');
    var more = el('button', { type: 'button' });
    more.addEventListener('click', function () { showMore(PAGE); });
    add(foot, status, more);
    add(s, el('div', { class: 'table-wrap' }, el('table', { id: id }, el('thead', null, thead), tbody)), foot);

    // Rank: position by size (largest first), as in the text report.
    var rank = new Array(rows.length);
    var bySize = rows.map(function (_, i) { return i; });
    bySize.sort(function (a, b) { return rows[b][0] - rows[a][0] || a - b; });
    bySize.forEach(function (ri, pos) { rank[ri] = pos + 1; });

    function sortBy(ci) {
      if (state.col === ci) state.desc = !state.desc; else { state.col = ci; state.desc = columns[ci].desc; }
      apply();
    }
    function apply() {
      var c = columns[state.col], sign = state.desc ? -1 : 1;
      var keys = rows.map(function (r, i) { return c.key(r, rank[i]); });
      var order = rows.map(function (_, i) { return i; });
      order.sort(function (a, b) {
        var x = keys[a], y = keys[b];
        if (x === y) return rank[a] - rank[b];
        if (x == null) return 1;
        if (y == null) return -1;
        return (x < y ? -1 : 1) * sign;
      });
      state.order = order;
      ths.forEach(function (th, i) {
        th.setAttribute('aria-sort', i === state.col ? (state.desc ? 'descending' : 'ascending') : 'none');
        th.lastChild.textContent = i === state.col ? (state.desc ? '▼' : '▲') : '';
      });
      tbody.textContent = '';
      state.shown = 0;
      showMore(PAGE);
    }
    function showMore(n) {
      var frag = document.createDocumentFragment();
      var end = Math.min(state.order.length, state.shown + n);
      for (var i = state.shown; i < end; i++) {
        var ri = state.order[i], r = rows[ri];
        frag.appendChild(el('tr', null, columns.map(function (c) { return c.cell(r, rank[ri]); })));
      }
      tbody.appendChild(frag);
      state.shown = end;
      status.textContent = 'Showing ' + thousands(state.shown) + ' of ' + thousands(rows.length) + (rows.length ? '; click a column header to sort.' : '.');
      more.hidden = state.shown >= rows.length;
      more.textContent = 'Show ' + thousands(Math.min(PAGE, rows.length - state.shown)) + ' more';
    }
    apply();
    return { sortBy: sortBy, state: state, rows: rows, columns: columns, tbody: tbody, more: more };
  }
  function td(text, cls, title) { return el('td', { class: cls, text: text, title: title }); }
  var tables = {};

  // Identical holders (same size, API, device and stack: a leak's twenty 96 MiB activations) are
  // one row, count × size. Row layout, column 0 the row's bytes (the tables rank by it):
  var G = { bytes: 0, count: 1, size: 2, api: 3, device: 4, thread: 5, age_min: 6, age_max: 7, seq_min: 8, seq_max: 9, address: 10, stream: 11, stack: 12 };
  function groupHolders() {
    var h = HC, groups = new Map(), rows = [];
    D.holders.forEach(function (r) {
      var key = r[h.bytes] + '\u0000' + r[h.api] + '\u0000' + r[h.device] + '\u0000' + r[h.stack];
      var g = groups.get(key);
      var thread = r[h.thread_name] != null ? r[h.thread_name] + ' (' + r[h.thread] + ')' : String(r[h.thread]);
      if (!g) {
        g = [0, 0, r[h.bytes], r[h.api], r[h.device], thread, r[h.age_s], r[h.age_s], r[h.seq], r[h.seq], r[h.address], r[h.stream], r[h.stack]];
        groups.set(key, g);
        rows.push(g);
      }
      g[G.bytes] += r[h.bytes];
      g[G.count] += 1;
      if (g[G.thread] !== thread) g[G.thread] = 'several threads';
      if (r[h.age_s] != null) {
        if (g[G.age_min] == null || r[h.age_s] < g[G.age_min]) g[G.age_min] = r[h.age_s];
        if (g[G.age_max] == null || r[h.age_s] > g[G.age_max]) g[G.age_max] = r[h.age_s];
      }
      if (r[h.seq] < g[G.seq_min]) { g[G.seq_min] = r[h.seq]; g[G.address] = r[h.address]; g[G.stream] = r[h.stream]; }
      if (r[h.seq] > g[G.seq_max]) g[G.seq_max] = r[h.seq];
    });
    return rows;
  }
  function range(lo, hi, fmt) { return lo === hi ? fmt(lo) : fmt(lo) + '–' + fmt(hi); }

  section('holders', function (s) {
    var live = D.recording.live_allocations;
    var rows = groupHolders();
    var grouped = D.holders.length - rows.length;
    add(s, el('h2', { text: 'Largest holders' }),
      el('p', { class: 'muted', id: 'holders-note', text: thousands(D.holders.length) + ' listed in the dump; ' + plural(live, 'allocation', 'allocations') + ' live when it was written.' +
        (grouped ? ' Identical holders (same size, API, device and stack) are one row: ' + thousands(D.holders.length) + ' holders in ' + thousands(rows.length) + ' rows.' : '') }));
    if (!D.holders.length) { add(s, el('p', { class: 'muted', text: 'The dump lists no live allocations.' })); return; }
    tables.holders = sortableTable(s, 'holders-table', rows, [
      { label: '#', num: true, key: function (r, rk) { return rk; }, desc: false, cell: function (r, rk) { return td(rk, 'num'); } },
      { label: 'bytes', num: true, key: function (r) { return r[G.bytes]; }, desc: true, cell: function (r) { return td(humanBytes(r[G.bytes]), 'num', thousands(r[G.bytes]) + ' bytes'); } },
      { label: 'count × size', num: true, key: function (r) { return r[G.count]; }, desc: true, cell: function (r) { return td(r[G.count] > 1 ? thousands(r[G.count]) + ' × ' + humanBytes(r[G.size]) : humanBytes(r[G.size]), 'num'); } },
      { label: 'api', key: function (r) { return r[G.api]; }, desc: false, cell: function (r) { return td(r[G.api], 'mono'); } },
      { label: 'dev', num: true, key: function (r) { return r[G.device]; }, desc: false, cell: function (r) { return td(r[G.device], 'num'); } },
      { label: 'thread', key: function (r) { return r[G.thread]; }, desc: false, cell: function (r) { return td(r[G.thread], 'mono'); } },
      { label: 'age', num: true, key: function (r) { return r[G.age_max]; }, desc: true, cell: function (r) { return td(range(r[G.age_min], r[G.age_max], humanAge), 'num'); } },
      { label: 'seq', num: true, key: function (r) { return r[G.seq_min]; }, desc: true, cell: function (r) { return td(range(r[G.seq_min], r[G.seq_max], thousands), 'num'); } },
      { label: 'address', key: function (r) { return r[G.address]; }, desc: false, cell: function (r) { return td(r[G.address] + (r[G.count] > 1 ? ' (first of ' + thousands(r[G.count]) + ')' : ''), 'mono', r[G.stream] != null ? 'stream ' + r[G.stream] : null); } },
      { label: 'stack', key: function (r) { return topLabel(r[G.stack]); }, desc: false, cell: function (r) { return el('td', null, stackCell(r[G.stack], 3)); } }
    ], 1);
  });

  section('sites', function (s) {
    add(s, el('h2', { text: 'Allocation sites' }),
      el('p', { class: 'muted', text: plural(D.sites.length, 'site', 'sites') + ' listed in the dump; live bytes by allocation stack.' }));
    if (!D.sites.length) { add(s, el('p', { class: 'muted', text: 'The dump lists no allocation sites.' })); return; }
    var c = SC;
    tables.sites = sortableTable(s, 'sites-table', D.sites, [
      { label: '#', num: true, key: function (r, rk) { return rk; }, desc: false, cell: function (r, rk) { return td(rk, 'num'); } },
      { label: 'bytes', num: true, key: function (r) { return r[c.bytes]; }, desc: true, cell: function (r) { return td(humanBytes(r[c.bytes]), 'num', thousands(r[c.bytes]) + ' bytes'); } },
      { label: 'allocs', num: true, key: function (r) { return r[c.count]; }, desc: true, cell: function (r) { return td(thousands(r[c.count]), 'num'); } },
      { label: 'tracked %', num: true, key: function (r) { return r[c.bytes]; }, desc: true, cell: function (r) { return td(percent(r[c.bytes], trackedTotal), 'num'); } },
      { label: 'stack', key: function (r) { return topLabel(r[c.stack]); }, desc: false, cell: function (r) { return el('td', null, stackCell(r[c.stack], 3)); } }
    ], 1);
  });

  // ---- free blocks ---------------------------------------------------------------------------

  section('free-blocks', function (s) {
    var fb = D.free_blocks, req = D.failed_request;
    add(s, el('h2', { text: 'Free blocks' }));
    if (!fb.available) {
      add(s, el('p', { id: 'free-blocks-unavailable' }, el('strong', { text: 'Unavailable' }), fb.reason ? ': ' + fb.reason : ' (source: ' + fb.source + ')'));
      return;
    }
    var dl = el('dl', { class: 'kv' });
    function row(k, v) { add(dl, el('dt', { text: k }), el('dd', { text: v })); }
    row('source', fb.source);
    row('total free', humanBytes(fb.total_free_bytes));
    row('largest free block', humanBytes(fb.largest_free_bytes));
    if (fb.fragmentation != null) row('fragmentation', (fb.fragmentation * 100).toFixed(1) + '% (1 − largest / total free)');
    if (req) row('failed request', humanBytes(req.bytes) + (fb.largest_free_bytes != null && req.bytes > fb.largest_free_bytes ? ': larger than the largest free block' : ''));
    add(s, dl);
    var bins = fb.histogram;
    if (!bins.length) { add(s, el('p', { class: 'muted', text: 'No histogram in this dump.' })); return; }
    var mode = 'bytes';
    var controls = el('div', { class: 'controls' });
    var chart = el('div');
    ['bytes', 'count'].forEach(function (m) {
      var input = el('input', { type: 'radio', name: 'hist-mode', value: m });
      input.checked = m === mode;
      input.addEventListener('change', function () { if (input.checked) { mode = m; draw(); } });
      add(controls, el('label', null, input, ' ', m === 'bytes' ? 'free bytes per size class' : 'free blocks per size class'));
    });
    add(s, el('h3', { text: 'Histogram of free blocks by size' }), controls, chart);
    function draw() {
      chart.textContent = '';
      var vi = mode === 'bytes' ? 3 : 2;
      var max = bins.reduce(function (m, b) { return Math.max(m, b[vi]); }, 0) || 1;
      var hist = el('div', { class: 'hist', id: 'free-histogram' });
      var labels = el('div', { class: 'hist-labels' });
      bins.forEach(function (b) {
        var v = b[vi];
        add(hist, el('div', { class: 'bar', title: humanBytes(b[0]) + ' – ' + humanBytes(b[1]) + ': ' + plural(b[2], 'block', 'blocks') + ', ' + humanBytes(b[3]) },
          el('div', { class: 'val', text: mode === 'bytes' ? humanBytes(v) : thousands(v) }),
          el('div', { class: 'fill', style: 'height:' + (v * 100 / max).toFixed(2) + '%' })));
        add(labels, el('div', { title: humanBytes(b[0]) + ' – ' + humanBytes(b[1]), text: humanBytes(b[0]) + '–' + humanBytes(b[1]) }));
      });
      if (req) {
        // The request's place on the (ordered) bins: inside the bin that holds it, log-scaled.
        var n = bins.length, pos = n, x = req.bytes;
        for (var i = 0; i < n; i++) {
          var lo = bins[i][0], hi = bins[i][1];
          if (x < lo) { pos = i; break; }
          if (x < hi) {
            var f = lo > 0 ? (Math.log(x) - Math.log(lo)) / (Math.log(hi) - Math.log(lo)) : (x - lo) / (hi - lo);
            pos = i + Math.min(Math.max(f, 0), 1);
            break;
          }
        }
        var right = pos > n / 2;
        var marker = el('div', { class: 'marker' + (right ? ' right' : ''), id: 'request-marker', title: 'failed request: ' + exact(x) },
          el('span', { text: (pos >= n ? 'request ' + humanBytes(x) + ' (larger than every bin) →' : '▼ request ' + humanBytes(x)) }));
        // 4px padding each side and 4px gaps: place by fraction of the bar area.
        marker.style.left = 'calc(4px + (100% - 8px) * ' + (pos / n).toFixed(5) + ')';
        add(hist, marker);
      }
      add(chart, hist, labels);
    }
    draw();
  });

  // ---- other processes (only when the dump has them) ---------------------------------------------

  section('processes', function (s) {
    var ps = D.processes;
    if (!Array.isArray(ps) || !ps.length || typeof ps[0] !== 'object' || !ps[0]) return;
    s.hidden = false;
    var keys = Object.keys(ps[0]);
    add(s, el('h2', { text: 'Other processes on the device' }),
      el('table', null, el('thead', null, el('tr', null, keys.map(function (k) { return el('th', { text: k }); }))),
        el('tbody', null, ps.map(function (p) {
          return el('tr', null, keys.map(function (k) {
            var v = p && typeof p === 'object' ? p[k] : null;
            return td(/bytes/.test(k) && typeof v === 'number' ? humanBytes(v) : v == null ? '' : typeof v === 'object' ? JSON.stringify(v) : String(v));
          }));
        }))));
  });

  section('recording', function (s) {
    var r = D.recording;
    add(s, el('h2', { text: 'Recording' }));
    add(s, el('p', { class: 'muted', text: 'oomshim ' + r.version + ', stacks ' + r.stacks + (r.python ? ' (' + r.python + ')' : '') + ' (depth ' + r.depth + '); ' +
      plural(r.live_allocations, 'allocation', 'allocations') + ' live, ' + thousands(r.total_allocations) + ' recorded in total, ' +
      plural(r.unknown_frees, 'unknown free', 'unknown frees') + ', ' + plural(r.oom_failures, 'OOM failure', 'OOM failures') + '. Dump schema ' + D.schema + '.' }));
  });

  var renderMs = performance.now() - T0;

  // ---- self-test (URL hash #selftest) ----------------------------------------------------------

  function selftest() {
    var checks = [];
    function check(name, ok, detail) { checks.push({ name: name, ok: !!ok, detail: detail == null ? null : String(detail) }); }
    function visible(e) { if (!e) return false; var r = e.getBoundingClientRect(); return r.width > 0 && r.height > 0; }
    try {
      var vk = byId('verdict-kind'), vs = byId('verdict-summary');
      check('verdict kind visible', visible(vk) && vk.textContent === D.verdict.kind, vk && vk.textContent);
      // Code spans are <code> elements: the text is the summary without its backticks.
      check('verdict summary visible', visible(vs) && vs.textContent === shown(D.verdict.summary).replace(/`/g, '') &&
        vs.textContent.length > 0);
      if (D.verdict.findings && D.verdict.findings.length > 1) {
        var fl = byId('verdict-findings');
        check('findings listed in rank order', visible(fl) && fl.children.length === D.verdict.findings.length &&
          fl.children[0].textContent.indexOf(D.verdict.findings[0].kind) === 0, fl && fl.children.length);
      }
      if (D.holders.length) {
        var max = tables.holders.rows.reduce(function (m, r) { return Math.max(m, r[G.bytes]); }, 0);
        var first = document.querySelector('#holders-table tbody tr');
        var cell = first && first.children[1];
        check('top holder visible', visible(first) && visible(cell) && cell.textContent === humanBytes(max), cell && cell.textContent);
      } else {
        check('top holder visible', true, 'no holders in dump');
      }
      // Flame: click the first box below the root, the zoom must change and the box fill the width.
      if (flame.root && flame.root.ch.size) {
        var graph = byId('flame-graph');
        var boxes = graph.querySelectorAll('.fl');
        var target = null;
        var gw0 = graph.getBoundingClientRect().width;
        // The first box below the root, preferring one narrower than the graph (so widths change).
        for (var i = 0; i < boxes.length; i++) {
          if (boxes[i].classList.contains('root')) continue;
          if (!target) target = boxes[i];
          if (boxes[i].getBoundingClientRect().width < gw0 - 3) { target = boxes[i]; break; }
        }
        var node = target && flame.boxes[+target.getAttribute('data-i')];
        var gw = graph.getBoundingClientRect().width;
        var before = target ? target.getBoundingClientRect().width : 0;
        check('flame boxes visible', visible(target) && boxes.length > 1, boxes.length + ' boxes');
        if (target) {
          var zoomBefore = flame.zoom;
          target.click();
          var zoomed = flame.zoom === node && zoomBefore !== node;
          var nb = null, all = graph.querySelectorAll('.fl');
          for (var j = 0; j < all.length; j++) { if (flame.boxes[+all[j].getAttribute('data-i')] === node && !all[j].classList.contains('anc')) nb = all[j]; }
          var after = nb ? nb.getBoundingClientRect().width : 0;
          check('flame click zooms', zoomed && nb && Math.abs(after - gw) < 3, 'width ' + before.toFixed(1) + ' -> ' + after.toFixed(1) + ' of ' + gw.toFixed(1));
          var crumb = byId('flame-crumbs').querySelector('a');
          if (crumb) crumb.click();
          check('breadcrumb zooms out', flame.zoom === flame.root);
        }
      } else {
        check('flame boxes visible', true, 'no stacks to draw');
      }
      // Sorting: click a header and compare the first row with the data's extreme value.
      var t = tables.holders || tables.sites;
      if (t) {
        var seqCol = t.columns.findIndex(function (c) { return c.label === (tables.holders ? 'seq' : 'allocs'); });
        var th = document.querySelector('#' + (tables.holders ? 'holders' : 'sites') + '-table th[data-col="' + t.columns[seqCol].label + '"]');
        var idx = tables.holders ? G.seq_min : SC.count;
        th.click();
        var desc = th.getAttribute('aria-sort') === 'descending';
        var vals = t.rows.map(function (r) { return r[idx]; });
        var want = desc ? Math.max.apply(null, vals.slice(0, 50000)) : Math.min.apply(null, vals.slice(0, 50000));
        if (vals.length > 50000) vals.forEach(function (v) { want = desc ? Math.max(want, v) : Math.min(want, v); });
        var firstRow = document.querySelector('#' + (tables.holders ? 'holders' : 'sites') + '-table tbody tr');
        var got = firstRow.children[seqCol].textContent.split('–')[0];
        check('header click sorts', got === thousands(want) && th.getAttribute('aria-sort') !== 'none', th.getAttribute('aria-sort') + ' first ' + got + ' want ' + thousands(want));
        th.click();
        var got2 = document.querySelector('#' + (tables.holders ? 'holders' : 'sites') + '-table tbody tr').children[seqCol].textContent.split('–')[0];
        var want2 = desc ? vals.reduce(function (m, v) { return Math.min(m, v); }, Infinity) : vals.reduce(function (m, v) { return Math.max(m, v); }, -Infinity);
        check('second click reverses', got2 === thousands(want2), got2 + ' want ' + thousands(want2));
        if (t.rows.length > PAGE) {
          var before = t.tbody.children.length;
          t.more.click();
          check('show more adds rows', before === PAGE && t.tbody.children.length === Math.min(2 * PAGE, t.rows.length),
            before + ' -> ' + t.tbody.children.length);
        }
        // Back to largest first.
        var bytesTh = document.querySelector('#' + (tables.holders ? 'holders' : 'sites') + '-table th[data-col="bytes"]');
        bytesTh.click();
        if (bytesTh.getAttribute('aria-sort') !== 'descending') bytesTh.click();
      } else {
        check('header click sorts', true, 'no table rows');
      }
      // Identical holders are one row each.
      if (tables.holders) {
        var keys = new Set(D.holders.map(function (r) { return r[HC.bytes] + '/' + r[HC.api] + '/' + r[HC.device] + '/' + r[HC.stack]; }));
        var counted = tables.holders.rows.reduce(function (a, r) { return a + r[G.count]; }, 0);
        check('identical holders grouped', tables.holders.rows.length === keys.size && counted === D.holders.length,
          D.holders.length + ' holders in ' + tables.holders.rows.length + ' rows');
      }
      // The growth chart: every sample on the line, the fit and the capacity where the dump has them.
      if (D.growth && D.growth.tracked.length >= 2) {
        var gc = growthChart;
        // A horizontal line has no height: drawn means present and wide.
        var wide = function (e) { return !!e && e.getBoundingClientRect().width > 100; };
        var parts = gc ? [visible(byId('growth-chart')), gc.line.points.numberOfItems === D.growth.tracked.length, wide(gc.line),
          !D.growth.sites.length || wide(byId('growth-fit')), !D.growth.capacity_bytes || wide(byId('growth-capacity'))] : [false];
        check('growth chart drawn', parts.every(Boolean),
          gc ? gc.points + ' points, fit ' + gc.fit + ', capacity ' + gc.capacity + (parts.every(Boolean) ? '' : ' [' + parts.join(',') + ']') : 'no chart');
      }
      if (gc) {
        // Round ticks: multiples of a 1/2/2.5/5 × 10^k step of their unit, none above capacity.
        var yt = gc.yTicks, unitOf = function (v) { var u = 1; while (u * 1024 <= v) u *= 1024; return u; };
        var mant = yt.step / unitOf(yt.step) / Math.pow(10, Math.floor(Math.log10(yt.step / unitOf(yt.step))));
        var topTick = yt.ticks[yt.ticks.length - 1];
        check('growth ticks round', yt.ticks.length >= 2 && [1, 2, 2.5, 5].some(function (x) { return Math.abs(x - mant) < 1e-6; }) &&
          (!D.growth.capacity_bytes || topTick <= D.growth.capacity_bytes),
          yt.ticks.map(humanBytes).join(', '));
      }
      // The holders' stacks are shown whole: no frame cut, the column inside the table's frame.
      if (tables.holders) {
        var wrapBox = byId('holders-table').closest('.table-wrap').getBoundingClientRect();
        var cut = 0, outside = 0;
        byId('holders-table').querySelectorAll('tbody .frames').forEach(function (f) {
          f.querySelectorAll('div').forEach(function (d) { if (d.scrollWidth > d.clientWidth + 1) cut++; });
          if (f.getBoundingClientRect().right > wrapBox.right + 1) outside++;
        });
        check('holders stacks unclipped', cut === 0 && outside === 0, cut + ' frames cut, ' + outside + ' stacks past the edge');
      }
      check('icicle defaults to sites', !D.sites.length || flame.source === 'sites', flame.source);
      // The answer in the first screen of a 1400 x 900 window: the verdict's headline, what
      // fills the device and the growth chart end within 900 px of the page's top.
      var bottom = function (e) { return e ? Math.round(e.getBoundingClientRect().bottom + window.scrollY) : null; };
      var hl = byId('headline'), fb = byId('fill'), gcv = byId('growth-chart');
      var firstScreen = { headline: bottom(hl), fill: bottom(fb), chart: bottom(gcv), width: window.innerWidth };
      check('answer in the first screen', visible(hl) && firstScreen.headline <= 900 &&
        (!D.fill || (visible(fb) && firstScreen.fill <= 900)) && (!gcv || firstScreen.chart <= 900), JSON.stringify(firstScreen));
      var sysShown = Array.prototype.some.call(byId('flame-graph') ? byId('flame-graph').querySelectorAll('.fl.sys') : [], function (b) { return true; });
      check('system frames folded', !sysShown, sysShown ? 'system frames drawn' : 'none drawn');
      // Verdict sentences: code spans are <code>, no literal backtick is left.
      var ticks = 0, walker = document.createTreeWalker(byId('verdict'), NodeFilter.SHOW_TEXT);
      while (walker.nextNode()) if (walker.currentNode.nodeValue.indexOf('`') >= 0) ticks++;
      check('no literal backticks in the verdict', ticks === 0, ticks + ' text nodes with backticks');
      var rows = document.querySelectorAll('tbody tr').length;
      check('DOM rows capped', rows <= 3 * PAGE + D.devices.length + 100, rows + ' rows');
      if (!D.free_blocks.available) {
        var un = byId('free-blocks-unavailable');
        check('free blocks reason shown', visible(un) && (!D.free_blocks.reason || un.textContent.indexOf(D.free_blocks.reason) >= 0));
      } else if (D.free_blocks.histogram.length) {
        check('histogram drawn', visible(byId('free-histogram')) && (!D.failed_request || visible(byId('request-marker'))));
      }
    } catch (err) {
      errors.push('selftest: ' + (err && err.stack ? err.stack : err));
    }
    check('no script errors', errors.length === 0, errors.join(' | '));
    var result = {
      passed: checks.every(function (c) { return c.ok; }),
      checks: checks,
      errors: errors,
      render_ms: Math.round(renderMs),
      holders: D.holders.length,
      sites: D.sites.length,
      flame_boxes: byId('flame-graph') ? byId('flame-graph').children.length : 0
    };
    document.body.appendChild(el('pre', { id: 'selftest-result', text: JSON.stringify(result) }));
  }
  if (SELFTEST) setTimeout(selftest, 0);
})();
