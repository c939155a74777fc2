// Time series from cumulative counters: samples of GET /stats/history and snapshots of GET /events are
// put in one shape, and each chart point is a rate between two consecutive samples. Counters are
// cumulative within a process, so a sample whose uptime or any counter went down follows a restart:
// that point is null, which the chart draws as a gap (a new segment), never as a negative rate.

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

/** Rates between consecutive samples: ``pick(sample)`` gives [numerator, denominator] counters, or a
 * denominator of "time" for a per-second rate. Returns {xs, ys} with null where there is no value
 * (a restart, a counter missing or gone down, or nothing in the denominator). */
export function rate(samples, numerator, denominator, scale = 1) {
  const xs = [];
  const ys = [];
  for (let i = 1; i < samples.length; i++) {
    const a = samples[i - 1];
    const b = samples[i];
    xs.push(b.t);
    const n = [numerator(a), numerator(b)];
    const d = denominator === "time" ? [a.t, b.t] : [denominator(a), denominator(b)];
    const values = [...n, ...d];
    const restarted = b.uptime < a.uptime || values.some((x) => x === null || x === undefined) || n[1] < n[0] || d[1] < d[0];
    ys.push(restarted || d[1] === d[0] ? null : ((n[1] - n[0]) / (d[1] - d[0])) * scale);
  }
  return {xs, ys};
}

export const hitRate = (samples) => rate(samples, (s) => s.hit_tokens, (s) => s.lookup_tokens, 100);
export const ttftMs = (samples) => rate(samples, (s) => s.ttft_sum_s, (s) => s.ttft_count, 1000);
export const tokensPerSecond = (samples) => rate(samples, (s) => s.completion_tokens_total, "time");
export const requestsPerSecond = (samples) => rate(samples, (s) => s.requests_total, "time");
export const pathBytesPerSecond = (samples, path) => rate(samples, (s) => s.bytes[path], "time");
