// Time charts drawn by the vendored uPlot (webui/vendor/): one TimeChart per figure, themed from the
// page's CSS colours (redrawn when the light/dark preference changes), sized to its box, and saying
// "no data" in words when it has no point to draw. The number of points drawn is kept in the box's
// data-points attribute (for people reading the DOM, and the browser tests).
// Invariant: the time axis spans at least MIN_SPAN_S and ticks at whole seconds or more, so one
// sample, or a few taken within a second, never get an axis of milliseconds (or of years: uPlot's
// own range for a lone x value), whatever uPlot's automatic range would pick.

const charts = new Set();
const darkQuery = window.matchMedia("(prefers-color-scheme: dark)");
darkQuery.addEventListener("change", () => charts.forEach((c) => c.rebuild()));

/** The shortest time axis, in seconds: samples come at most a few per second. */
export const MIN_SPAN_S = 60;
// Tick spacings offered to uPlot for the time axis (seconds): none below one second.
const TIME_INCRS_S = [1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200,
  86400, 2 * 86400, 7 * 86400, 14 * 86400, 30 * 86400, 91 * 86400, 182 * 86400, 365 * 86400];

/** [min, max] of the time axis for samples at ``xs`` (epoch seconds): their span, widened about its
 * middle to MIN_SPAN_S when shorter (one sample: centred; none: the last minute). */
export function timeRange(xs, nowS = Date.now() / 1000) {
  if (!xs.length) return [nowS - MIN_SPAN_S, nowS];
  const min = Math.min(...xs);
  const max = Math.max(...xs);
  if (max - min >= MIN_SPAN_S) return [min, max];
  const middle = (min + max) / 2;
  return [middle - MIN_SPAN_S / 2, middle + MIN_SPAN_S / 2];
}

/** uPlot's axis ``size``: as wide as the longest tick label needs (labels such as "1.50 GB/s" must not be
 * cut off at the chart's edge), at least ``minPx``. */
function fitLabels(minPx) {
  return (u, values, axisIndex, cycle) => {
    const axis = u.axes[axisIndex];
    if (cycle > 1) return axis._size;  // uPlot converges in a few passes: keep the last width
    const longest = (values || []).reduce((a, v) => (String(v).length > a.length ? String(v) : a), "");
    u.ctx.font = axis.font[0];
    const textPx = longest ? u.ctx.measureText(longest).width / devicePixelRatio : 0;
    return Math.max(minPx, Math.ceil(textPx + axis.ticks.size + axis.gap + 4));
  };
}

function css(name) {
  return getComputedStyle(document.documentElement).getPropertyValue(name).trim();
}

export class TimeChart {
  /** ``box``: an empty element; ``series``: [{label}], ``format``: value -> text (axis and legend);
   * ``yMax``: a fixed top of the y axis (e.g. 100 for a percentage), else the data's. */
  constructor(box, {series, format, yMax = null, height = 190}) {
    this.yMax = yMax;
    this.box = box;
    this.series = series;
    this.format = format;
    this.height = height;
    this.data = [[], ...series.map(() => [])];
    this.emptyText = "No data yet";
    this.plotBox = document.createElement("div");
    this.plotBox.className = "plot";
    this.note = document.createElement("p");
    this.note.className = "nodata";
    box.classList.add("chart");
    box.replaceChildren(this.plotBox, this.note);
    this.observer = new ResizeObserver(() => requestAnimationFrame(() => this.resize()));
    this.observer.observe(box);
    this.rebuild();
    charts.add(this);
  }

  options() {
    const fg = css("--fg-muted") || "#555";
    const grid = css("--grid") || "#ddd";
    const axis = {stroke: fg, grid: {stroke: grid, width: 1}, ticks: {stroke: grid, width: 1}};
    return {
      width: Math.max(200, this.box.clientWidth), height: this.height,
      scales: {
        // The time range is set from the data by setData (timeRange), not by uPlot; rates start at 0.
        x: {time: true, auto: false},
        y: {range: (u, min, max) => [0, this.yMax ?? (max > 0 ? max * 1.1 : 1)]},
      },
      legend: {show: true, live: true},
      cursor: {drag: {x: false, y: false}},
      series: [{value: (u, v) => (v === null || v === undefined ? "—" : new Date(v * 1000).toLocaleTimeString())},
        ...this.series.map((s, i) => ({
          label: s.label, stroke: css(`--chart-${i + 1}`) || "#36c", width: 2, spanGaps: false,
          points: {size: 5}, value: (u, v) => (v === null || v === undefined ? "—" : this.format(v)),
        }))],
      axes: [{...axis, incrs: TIME_INCRS_S}, {...axis, size: fitLabels(50), values: (u, splits) => splits.map((v) => this.format(v))}],
    };
  }

  rebuild() {
    if (this.plot) this.plot.destroy();
    this.plot = new uPlot(this.options(), this.data, this.plotBox);
    this.setTimeRange();
  }

  setTimeRange() {
    const [min, max] = timeRange(this.data[0]);
    this.plot.setScale("x", {min, max});
  }

  resize() {
    const width = Math.max(200, this.box.clientWidth);
    if (this.plot && this.plot.width !== width) this.plot.setSize({width, height: this.height});
  }

  /** ``xs``: epoch seconds; ``ys``: one array per series (null: a gap). ``emptyText``: said when nothing is drawn. */
  setData(xs, ys, emptyText = "No data yet") {
    this.data = [xs, ...ys];
    const points = ys.reduce((n, y) => n + y.filter((v) => v !== null && v !== undefined).length, 0);
    this.box.dataset.points = String(points);
    this.note.textContent = points ? "" : emptyText;
    this.note.hidden = points > 0;
    this.plot.setData(this.data, false);  // false: keep the scales; the time range is ours
    this.setTimeRange();
  }

  destroy() {
    this.observer.disconnect();
    this.plot.destroy();
    charts.delete(this);
  }
}
