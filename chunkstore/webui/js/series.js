// Time series from cumulative counters: samples of GET /stats/history and snapshots of GET /events are
// put in one shape, and each chart point is a rate between two consecutive samples. Counters are
// cumulative within a process, so a sample whose uptime or any counter went down follows a restart:
// that pair is a gap (a new segment), never a negative rate. A process's counters were all 0 when it
// started (uptime 0): the first sample of a process that started within about two sample intervals
// before it is also measured from that origin, so what was done before the first sample is drawn
// (requests made in a server's first seconds are not lost between its samples).

export const PATHS = ["device_to_host", "host_to_disk", "disk_to_host", "host_to_device"];

const sum = (...xs) => (xs.some((x) => x === null || x === undefined) ? null : xs.reduce((a, b) => a + b, 0));
const orNull = (x) => (x === undefined ? null : x);

/** A GET /stats/history sample in the common shape (fields it lacks are null). */
export function fromHistory(s) {
  return {
    t: s.sampled_at, uptime: s.uptime_s,
    lookup_tokens: orNull(s.lookup_tokens),
    hit_tokens: sum(s.hit_tokens_device, s.hit_tokens_host, s.hit_tokens_disk),
    requests_total: orNull(s.requests_total),
    completion_tokens_total: orNull(s.completion_tokens_total),
    ttft_sum_s: orNull(s.ttft_sum_s),
    ttft_count: orNull(s.ttft_count),
    bytes: Object.fromEntries(PATHS.map((p) => [p, orNull(s[`bytes_${p}`])])),
  };
}

/** A StatsPublic (GET /stats, or an `event: stats`) in the common shape. */
export function fromStats(st) {
  const hits = st.hits;
  const serving = st.serving || null;
  const hitTokens = hits ? Object.values(hits.hit_tokens || {}).reduce((a, b) => a + b, 0) : null;
  return {
    t: st.taken_at, uptime: st.uptime_s,
    lookup_tokens: hits ? hits.lookup_tokens : null,
    hit_tokens: hitTokens,
    requests_total: serving ? orNull(serving.requests_total) : null,
    completion_tokens_total: serving ? orNull(serving.completion_tokens_total) : null,
    ttft_sum_s: serving ? orNull(serving.ttft_sum_s) : null,
    ttft_count: serving ? orNull(serving.ttft_count) : null,
    bytes: Object.fromEntries(PATHS.map((p) => [p, st.paths && st.paths[p] ? st.paths[p].num_bytes : null])),
  };
}

/** Appends ``sample`` when it is newer than the last one; keeps at most ``max`` samples. */
export function push(samples, sample, max = 5000) {
  if (samples.length && sample.t <= samples[samples.length - 1].t) return;
  samples.push(sample);
  if (samples.length > max) samples.splice(0, samples.length - max);
}

// Without two samples to tell the interval, an origin up to this many seconds before the first counts.
const DEFAULT_GAP_S = 10;

function typicalGap(samples) {
  const gaps = [];
  for (let i = 1; i < samples.length; i++) if (samples[i].t > samples[i - 1].t) gaps.push(samples[i].t - samples[i - 1].t);
  if (!gaps.length) return DEFAULT_GAP_S;
  gaps.sort((x, y) => x - y);
  return gaps[Math.floor(gaps.length / 2)];
}

/** Rates between consecutive samples: ``pick(sample)`` gives [numerator, denominator] counters, or a
 * denominator of "time" for a per-second rate. Returns {xs, ys} with null where there is no value
 * (a restart, a counter missing or gone down, or nothing in the denominator). A process's first
 * sample, when its process started shortly before it, is measured from the process's start (all
 * counters 0); after a restart a null point at that start keeps the gap between the two segments. */
export function rate(samples, numerator, denominator, scale = 1) {
  const xs = [];
  const ys = [];
  const gap = typicalGap(samples);
  const value = (a, b) => {
    const n = [numerator(a), numerator(b)];
    const d = denominator === "time" ? [a.t, b.t] : [denominator(a), denominator(b)];
    const broken = [...n, ...d].some((x) => x === null || x === undefined) || n[1] < n[0] || d[1] < d[0];
    return broken || d[1] === d[0] ? null : ((n[1] - n[0]) / (d[1] - d[0])) * scale;
  };
  // The origin of ``b``'s process (its counters at 0), when it started recently enough to be drawn.
  const origin = (b, after) => {
    if (b.uptime === null || b.uptime === undefined || b.uptime <= 0 || b.uptime > 2 * gap) return null;
    const t = b.t - b.uptime;
    if (after !== null && t <= after) return null;
    const zero = (x) => (x === null || x === undefined ? x : 0);
    return {t, uptime: 0, lookup_tokens: zero(b.lookup_tokens), hit_tokens: zero(b.hit_tokens),
            requests_total: zero(b.requests_total), completion_tokens_total: zero(b.completion_tokens_total),
            ttft_sum_s: zero(b.ttft_sum_s), ttft_count: zero(b.ttft_count),
            bytes: Object.fromEntries(Object.entries(b.bytes || {}).map(([k, x]) => [k, zero(x)]))};
  };
  for (let i = 0; i < samples.length; i++) {
    const a = i > 0 ? samples[i - 1] : null;
    const b = samples[i];
    const restarted = a !== null && b.uptime < a.uptime;
    if (a !== null && !restarted) {
      xs.push(b.t);
      ys.push(value(a, b));
      continue;
    }
    const o = origin(b, a === null ? null : a.t);
    if (a !== null && o !== null) {
      xs.push(o.t);  // the gap between the old process's last sample and the new one's start
      ys.push(null);
    }
    if (a !== null || o !== null) {
      xs.push(b.t);
      ys.push(o === null ? null : value(o, b));
    }
  }
  return {xs, ys};
}

export const hitRate = (samples) => rate(samples, (s) => s.hit_tokens, (s) => s.lookup_tokens, 100);
export const ttftMs = (samples) => rate(samples, (s) => s.ttft_sum_s, (s) => s.ttft_count, 1000);
export const tokensPerSecond = (samples) => rate(samples, (s) => s.completion_tokens_total, "time");
export const requestsPerSecond = (samples) => rate(samples, (s) => s.requests_total, "time");
export const pathBytesPerSecond = (samples, path) => rate(samples, (s) => s.bytes[path], "time");
