// Time charts drawn by the vendored uPlot (webui/vendor/): one TimeChart per figure, themed from the
// page's CSS colours (redrawn when the light/dark preference changes), sized to its box, and saying
// "no data" in words when it has no point to draw. The number of points drawn is kept in the box's
// data-points attribute (for people reading the DOM, and the browser tests).

const charts = new Set();
const darkQuery = window.matchMedia("(prefers-color-scheme: dark)");
darkQuery.addEventListener("change", () => charts.forEach((c) => c.rebuild()));

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
        // One point alone would otherwise stretch the axis over years; rates start at 0.
        x: {time: true, range: (u, min, max) => (min === max ? [min - 30, max + 30] : [min, max])},
        y: {range: (u, min, max) => [0, this.yMax ?? (max > 0 ? max * 1.1 : 1)]},
      },
      legend: {show: true, live: true},
      cursor: {drag: {x: false, y: false}},
      series: [{value: (u, v) => (v === null || v === undefined ? "—" : new Date(v * 1000).toLocaleTimeString())},
        ...this.series.map((s, i) => ({
          label: s.label, stroke: css(`--chart-${i + 1}`) || "#36c", width: 2, spanGaps: false,
          points: {size: 5}, value: (u, v) => (v === null || v === undefined ? "—" : this.format(v)),
        }))],
      axes: [{...axis}, {...axis, size: 70, values: (u, splits) => splits.map((v) => this.format(v))}],
    };
  }

  rebuild() {
    if (this.plot) this.plot.destroy();
    this.plot = new uPlot(this.options(), this.data, this.plotBox);
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
    this.plot.setData(this.data);
  }

  destroy() {
    this.observer.disconnect();
    this.plot.destroy();
    charts.delete(this);
  }
}
