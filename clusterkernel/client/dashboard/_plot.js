// The dashboard's plot, drawn on a <canvas> (see _plot.py for why not SVG).
//
// The model holds the whole picture: axis ranges, and every series' points as one
// binary float64 buffer (series after series, all x then all y). A change schedules
// one redraw at the next animation frame, however many traits changed.
// After each redraw the element carries what was drawn, for tests and benchmarks:
//   data-frames: redraws so far;  data-drawn: finite points drawn per series;
//   data-yticks: each y tick's label and the pixel row it was drawn at ("0:31,1:72");
//   data-xticks: the x ticks' labels ("0,500,1000").
// A range from high to low (ylim [3.6, -0.6]) runs that axis the other way.

const MARGIN = { left: 58, right: 12, top: 8, bottom: 34 };
const FONT = "11px sans-serif";

function niceTicks(lo, hi, count) {
  const span = hi - lo;
  if (span < 0) return niceTicks(hi, lo, count); // a reversed axis: the same ticks
  if (!(span > 0) || !isFinite(span)) return Object.assign([lo], { step: 0 });
  const raw = span / count;
  const mag = Math.pow(10, Math.floor(Math.log10(raw)));
  const steps = [0.1, 0.2, 0.5, 1, 2, 5, 10].map((m) => m * mag);
  // the smallest step of at least span / count; if that leaves a single tick (1000
  // on [1, 1200]: "1000" alone gives no scale), the largest smaller one with two
  const order = steps.filter((s) => s >= raw).concat(steps.filter((s) => s < raw).reverse());
  let ticks = [];
  for (const step of order) {
    ticks = ticksAt(lo, hi, step);
    if (ticks.length >= 2) break;
  }
  return ticks;
}

function ticksAt(lo, hi, step) {
  // by index, and at most 50: adding a step far below the values' precision
  // (a range of 1e-10 around 1e6) would never get past the first tick
  const first = Math.ceil(lo / step - 1e-9);
  const ticks = [];
  for (let i = 0; i < 50; i++) {
    const v = (first + i) * step;
    if (v > hi + step * 1e-9) break;
    ticks.push(Math.abs(v) < step * 1e-9 ? 0 : v);
  }
  ticks.step = step;
  return ticks;
}

function decimals(step) {
  if (!(step > 0)) return 0;
  return Math.min(6, Math.max(0, Math.ceil(-Math.log10(step) - 1e-9)));
}

function formatter(ticks, format) {
  // One format for all of an axis's ticks, with the decimals its step needs (so
  // neighbours never read the same) and one unit (k, M, G) for large values.
  if (format === "d") return (v) => String(Math.round(v));
  const step = ticks.step || 0;
  const big = Math.max(...ticks.map(Math.abs), 0);
  if (big !== 0 && big < 1e-3) return (v) => (v === 0 ? "0" : v.toExponential(1));
  // steps up to 9999 read best as they are; beyond, in thousands, millions, ...
  for (const [unit, suffix] of [[1e9, "G"], [1e6, "M"], [1e3, "k"]]) {
    if (big >= Math.max(unit, 1e4)) {
      const d = decimals(step / unit);
      return (v) => (v === 0 ? "0" : (v / unit).toFixed(d) + suffix);
    }
  }
  const d = decimals(step);
  return (v) => v.toFixed(d);
}

function columns(view) {
  // Copy: a DataView's offset into its buffer need not be a multiple of 8.
  if (!view || view.byteLength === 0) return new Float64Array(0);
  if (view instanceof ArrayBuffer) return new Float64Array(view.slice(0));
  return new Float64Array(view.buffer.slice(view.byteOffset, view.byteOffset + view.byteLength));
}

function draw(model, el, canvas, legend, size) {
  const { width, height } = size; // from the ResizeObserver: reading clientWidth would force a layout
  if (width === 0 || height === 0) return; // not laid out (yet): drawn on resize
  const dpr = window.devicePixelRatio || 1;
  if (canvas.width !== Math.round(width * dpr) || canvas.height !== Math.round(height * dpr)) {
    canvas.width = Math.round(width * dpr);
    canvas.height = Math.round(height * dpr);
  }
  const ctx = canvas.getContext("2d");
  ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
  ctx.clearRect(0, 0, width, height);

  const [x0, x1] = model.get("xlim");
  const [y0, y1] = model.get("ylim");
  const left = MARGIN.left, top = MARGIN.top;
  const pw = Math.max(width - MARGIN.left - MARGIN.right, 1);
  const ph = Math.max(height - MARGIN.top - MARGIN.bottom, 1);
  const sx = pw / (x1 - x0 || 1), sy = ph / (y1 - y0 || 1);
  const px = (x) => left + (x - x0) * sx;
  const py = (y) => top + ph - (y - y0) * sy;

  // axes: frame, ticks, labels
  ctx.font = FONT;
  ctx.strokeStyle = "#999";
  ctx.lineWidth = 1;
  ctx.strokeRect(left, top, pw, ph);
  ctx.fillStyle = "#333";
  ctx.textAlign = "center";
  ctx.textBaseline = "top";
  const xt = niceTicks(x0, x1, Math.max(2, Math.floor(pw / 90)));
  const xl = formatter(xt, "");
  for (const t of xt) ctx.fillText(xl(t), px(t), top + ph + 4);
  el.dataset.xticks = xt.map(xl).join(",");
  ctx.fillText(model.get("xlabel"), left + pw / 2, top + ph + 18);
  ctx.textAlign = "right";
  ctx.textBaseline = "middle";
  const fixed = model.get("yticks");
  const yt = fixed.length ? [...fixed] : niceTicks(y0, y1, Math.max(2, Math.floor(ph / 40)));
  const fmt = model.get("ytick_format");
  if (fixed.length) yt.step = fixed.length > 1 ? Math.abs(fixed[1] - fixed[0]) : 0;
  const yl = formatter(yt, fmt);
  for (const t of yt) ctx.fillText(yl(t), left - 5, py(t));
  el.dataset.yticks = yt.map((t) => `${yl(t)}:${Math.round(py(t))}`).join(",");
  ctx.save();
  ctx.translate(12, top + ph / 2);
  ctx.rotate(-Math.PI / 2);
  ctx.textAlign = "center";
  ctx.fillText(model.get("ylabel"), 0, 0);
  ctx.restore();

  // series, clipped to the plot area
  const data = columns(model.get("data"));
  const series = model.get("series");
  const drawn = [];
  ctx.save();
  ctx.beginPath();
  ctx.rect(left, top, pw, ph);
  ctx.clip();
  let at = 0;
  for (const s of series) {
    const xs = data.subarray(at, at + s.n), ys = data.subarray(at + s.n, at + 2 * s.n);
    at += 2 * s.n;
    ctx.strokeStyle = s.color;
    ctx.lineWidth = s.width;
    ctx.lineCap = "butt";
    ctx.lineJoin = "round";
    ctx.beginPath();
    let count = 0;
    if (s.kind === "segments") {
      // (x[2i], y[2i]) to (x[2i+1], y[2i+1]): one bar each
      for (let i = 0; i + 1 < s.n; i += 2) {
        ctx.moveTo(px(xs[i]), py(ys[i]));
        ctx.lineTo(px(xs[i + 1]), py(ys[i + 1]));
        count += 2;
      }
    } else {
      let pen = false; // NaN lifts the pen
      for (let i = 0; i < s.n; i++) {
        if (!isFinite(xs[i]) || !isFinite(ys[i])) { pen = false; continue; }
        if (pen) ctx.lineTo(px(xs[i]), py(ys[i]));
        else ctx.moveTo(px(xs[i]), py(ys[i]));
        pen = true;
        count++;
      }
    }
    ctx.stroke();
    drawn.push(count);
  }
  ctx.restore();

  const names = series.filter((s) => s.label).map((s) => `${s.color}\u0000${s.label}`).join("\u0001");
  if (names !== legend.dataset.names) {
    legend.dataset.names = names;
    legend.replaceChildren(
      ...series.filter((s) => s.label).map((s) => {
        const item = document.createElement("span");
        item.style.marginRight = "10px";
        const box = document.createElement("span");
        box.textContent = "\u25A0 ";
        box.style.color = s.color;
        item.append(box, s.label);
        return item;
      }),
    );
  }
  el.dataset.drawn = drawn.join(",");
  el.dataset.frames = String(Number(el.dataset.frames || 0) + 1);
}

function render({ model, el }) {
  el.classList.add("ck-plot");
  const title = document.createElement("div");
  title.className = "ck-plot-title";
  title.style.cssText = "font:bold 13px sans-serif;text-align:center;margin:2px 0";
  const legend = document.createElement("div");
  legend.className = "ck-plot-legend";
  legend.style.cssText = "font:11px sans-serif;text-align:center;min-height:14px";
  const canvas = document.createElement("canvas");
  canvas.style.cssText = `display:block;width:100%;height:${model.get("height")}px`;
  el.append(title, legend, canvas);

  let pending = false;
  let size = { width: 0, height: 0 };
  const redraw = () => {
    if (pending) return;
    pending = true;
    requestAnimationFrame(() => {
      pending = false;
      // only when changed: a new text node would make the page lay out again
      if (title.textContent !== model.get("title")) title.textContent = model.get("title");
      draw(model, el, canvas, legend, size);
    });
  };
  const traits = ["data", "series", "xlim", "ylim", "yticks", "title", "xlabel", "ylabel"];
  for (const t of traits) model.on(`change:${t}`, redraw);
  const resize = new ResizeObserver((entries) => {
    const box = entries[entries.length - 1].contentRect;
    size = { width: box.width, height: box.height };
    redraw();
  });
  resize.observe(canvas);
  redraw();
  return () => {
    resize.disconnect();
    for (const t of traits) model.off(`change:${t}`, redraw);
  };
}

export default { render };
