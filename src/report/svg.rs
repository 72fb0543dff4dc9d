//! One drill's timeline drawn as a standalone SVG chart: records delivered per second (left
//! axis) and the engine's backlog of waiting records (right axis) over the drill's clock, the
//! fault windows shaded as bands, and the engine's kills, restarts, first delivery and drain as
//! marked instants. [`render`] turns a [`Chart`] into one complete SVG document — fixed size,
//! white background, no scripts, no external fonts or stylesheets — that a browser shows and
//! GitHub renders from a relative image link in `report.md`. This module only draws: it never
//! reads or writes files, never measures anything and never judges a drill; the caller hands it
//! what was observed and decides where the text goes. Degenerate inputs (no samples, a zero
//! duration, windows past the end, NaN or huge rates) draw a sparse chart, never a panic.

use std::fmt::Write as _;

/// One observation of the pipeline, taken at least once per second of the drill.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    /// When the sample was taken, in milliseconds since the drill started.
    pub at_ms: u64,
    /// Records delivered to the destination per second around this instant. NaN, negative and
    /// infinite values are drawn as 0, 0 and a clamped maximum.
    pub delivered_per_s: f64,
    /// Records the engine reported as waiting (its backlog), or `None` when it did not answer;
    /// `None` leaves a gap in the backlog line.
    pub waiting: Option<u64>,
    /// Records the source the engine pulls from held unread (or not passed), on the right
    /// axis with the backlog; `None` leaves a gap (no source: no line).
    pub unread: Option<u64>,
}

/// A fault in force during part of the drill, drawn as a shaded band.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Window {
    /// When the fault was applied, in milliseconds since the drill started.
    pub from_ms: u64,
    /// When the fault was healed, or `None` when it lasted until the end of the drill.
    pub until_ms: Option<u64>,
    /// What the fault was, e.g. `link mqtt swallow both`; shown above the band.
    pub label: String,
    /// What the fault acted on: its band's colour.
    pub band: Band,
}

/// What a fault window acted on, each kind a colour of its own: the network (a link, the
/// proxy), the engine's disk, the engine's clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Band {
    #[default]
    Network,
    Disk,
    Clock,
}

impl Band {
    fn colour(self) -> &'static str {
        match self {
            Band::Network => COLOUR_FAULT,
            Band::Disk => COLOUR_DISK,
            Band::Clock => COLOUR_CLOCK,
        }
    }

    /// The band's class beside `fault`, and its legend entry.
    fn name(self) -> (&'static str, &'static str) {
        match self {
            Band::Network => ("network", "fault in force"),
            Band::Disk => ("disk", "disk fault"),
            Band::Clock => ("clock", "clock jump"),
        }
    }
}

/// What kind of instant a [`Mark`] records; it decides the mark's colour and line style.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MarkKind {
    /// The engine (or a broker) was started again.
    Restart,
    /// The engine (or a broker) was killed.
    Kill,
    /// The first record arrived at the destination after a heal.
    FirstDelivery,
    /// The backlog reached zero after a heal.
    Drained,
}

/// An instant worth a vertical line on the chart.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mark {
    /// When it happened, in milliseconds since the drill started.
    pub at_ms: u64,
    /// What happened.
    pub kind: MarkKind,
    /// A short label drawn next to the line; empty means the kind's own name.
    pub label: String,
}

/// Everything one chart shows, borrowed from the caller.
#[derive(Debug, Clone, Copy)]
pub struct Chart<'a> {
    /// The chart's title, e.g. the drill's name; escaped, and shortened if it would not fit.
    pub title: &'a str,
    /// The drill's length in milliseconds: the x axis runs from 0 to here. When it is 0 the
    /// axis runs to the latest instant the chart mentions instead (at least 1 ms).
    pub duration_ms: u64,
    /// The observations, in any order; samples after the end of the axis are not drawn.
    pub samples: &'a [Sample],
    /// The faults in force; parts beyond the end of the axis are clipped.
    pub windows: &'a [Window],
    /// The marked instants; instants beyond the end of the axis are drawn at its end.
    pub marks: &'a [Mark],
}

/// Width of every chart, in SVG user units (CSS pixels).
const WIDTH: f64 = 960.0;
/// Height of every chart, in SVG user units (CSS pixels).
const HEIGHT: f64 = 360.0;
/// Left edge of the plot area (room for the left axis and its title).
const PLOT_LEFT: f64 = 66.0;
/// Right edge of the plot area (room for the right axis and its title).
const PLOT_RIGHT: f64 = WIDTH - 74.0;
/// Bottom edge of the plot area (room for tick labels, the axis title and the legend).
const PLOT_BOTTOM: f64 = HEIGHT - 70.0;
/// Top of the first lane of fault labels, just below the title.
const HEADER_TOP: f64 = 32.0;
/// Height of one lane of fault labels.
const FAULT_LANE_H: f64 = 15.0;
/// At most this many lanes of fault labels; further overlapping labels share the least busy lane.
const MAX_FAULT_LANES: usize = 4;
/// Height of one lane of mark labels (inside the top of the plot).
const MARK_LANE_H: f64 = 12.0;
/// At most this many lanes of mark labels.
const MAX_MARK_LANES: usize = 4;
/// The title's font size, widened a little for its bold face when measuring.
const TITLE_EM: f64 = 15.0 * 1.1;
/// Rates and backlogs above this are drawn at this value, so the axes stay finite.
const VALUE_CAP: f64 = 1e15;

/// Title and default text: near black.
const COLOUR_TEXT: &str = "#212529";
/// Time tick labels, axis title and legend text: dark grey.
const COLOUR_MUTED: &str = "#5c636a";
/// Grid lines: very light grey.
const COLOUR_GRID: &str = "#e9ecef";
/// Axis lines and tick marks: mid grey.
const COLOUR_AXIS: &str = "#868e96";
/// The delivered series, its axis and its title: blue.
const COLOUR_DELIVERED: &str = "#1971c2";
/// The backlog series, its axis and its title: orange.
const COLOUR_BACKLOG: &str = "#e8590c";
/// What the source held unread: dashed, beside the backlog on the right axis.
const COLOUR_UNREAD: &str = "#7048e8";
/// Fault bands (translucent) and the bars under their labels: grey.
const COLOUR_FAULT: &str = "#adb5bd";
/// Disk faults' bands (the engine's data directory): amber.
const COLOUR_DISK: &str = "#f08c00";
/// Clock faults' bands (the engine's wall clock): violet.
const COLOUR_CLOCK: &str = "#9c36b5";
/// The narrowest band drawn: an instant (a clock jump, one failed operation) stays visible.
const MIN_BAND_W: f64 = 3.0;
/// Fault labels: dark grey.
const COLOUR_FAULT_TEXT: &str = "#495057";
/// Kill and restart marks: dark red.
const COLOUR_STOP: &str = "#a51d2d";
/// First-delivery and drained marks: green.
const COLOUR_GO: &str = "#2b8a3e";

/// The x position of an instant on the drill's clock, in SVG user units: 0 ms is the plot's
/// left edge, the end of the axis its right edge; later instants are clamped to the right edge.
pub fn x_of(chart: &Chart<'_>, at_ms: u64) -> f64 {
    x_at(span_ms(chart), at_ms)
}

/// [`x_of`] on a time axis ending at `span_ms` (not 0).
fn x_at(span_ms: u64, at_ms: u64) -> f64 {
    let t = at_ms.min(span_ms) as f64 / span_ms.max(1) as f64;
    PLOT_LEFT + t * (PLOT_RIGHT - PLOT_LEFT)
}

/// Renders the chart as a complete standalone SVG document (XML declaration included).
pub fn render(chart: &Chart<'_>) -> String {
    let frame = Frame::new(chart);
    let mut svg = String::with_capacity(16 * 1024);
    open_document(&mut svg, chart);
    // Back to front: grid, fault bands, the two series, mark lines, then axes and all text.
    grid(&mut svg, &frame);
    fault_bands(&mut svg, &frame);
    delivered_series(&mut svg, &frame);
    backlog_series(&mut svg, &frame);
    mark_lines(&mut svg, &frame);
    axes(&mut svg, &frame);
    fault_label_lanes(&mut svg, &frame);
    mark_labels(&mut svg, &frame);
    legend(&mut svg, &frame);
    svg.push_str("</svg>\n");
    svg
}

/// A value axis: 0 at the plot's bottom, `top` at the plot's top, a tick every `step`.
struct Scale {
    /// The value at the plot's top, a whole number of steps.
    top: f64,
    /// The distance between ticks.
    step: f64,
}

/// The chart's layout, worked out once: the time axis, where the plot starts (below the fault
/// label lanes), the two value axes, and the things to draw in time order.
struct Frame<'c, 'a> {
    /// What is drawn.
    chart: &'c Chart<'a>,
    /// The end of the time axis in milliseconds (see [`span_ms`]).
    span: u64,
    /// The samples on the time axis, in time order.
    samples: Vec<&'a Sample>,
    /// The marks, in time order.
    marks: Vec<&'a Mark>,
    /// The fault labels, laid out in lanes above the plot.
    faults: Vec<FaultLabel>,
    /// Top edge of the plot area.
    plot_top: f64,
    /// Delivered records per second.
    left: Scale,
    /// The backlog, or `None` when no sample on the axis reported it.
    right: Option<Scale>,
}

impl<'c, 'a> Frame<'c, 'a> {
    /// Lays the chart out.
    fn new(chart: &'c Chart<'a>) -> Self {
        let span = span_ms(chart);
        let mut samples: Vec<&Sample> = chart.samples.iter().filter(|s| s.at_ms <= span).collect();
        samples.sort_by_key(|s| s.at_ms);
        let mut marks: Vec<&Mark> = chart.marks.iter().collect();
        marks.sort_by_key(|m| m.at_ms);
        let faults = fault_labels(chart, span);
        let lanes_used = faults.iter().map(|f| f.lane + 1).max().unwrap_or(0);
        let plot_top = HEADER_TOP + lanes_used as f64 * FAULT_LANE_H + 6.0;
        let rate_max = samples
            .iter()
            .map(|s| clean(s.delivered_per_s))
            .fold(0.0, f64::max);
        let left = nice_axis(rate_max);
        let waiting: Vec<f64> = samples
            .iter()
            .flat_map(|s| [s.waiting, s.unread])
            .flatten()
            .map(|w| w as f64)
            .collect();
        let right =
            (!waiting.is_empty()).then(|| nice_axis(waiting.iter().copied().fold(0.0, f64::max)));
        Frame {
            chart,
            span,
            samples,
            marks,
            faults,
            plot_top,
            left,
            right,
        }
    }

    /// The x position of an instant (see [`x_of`]).
    fn x(&self, at_ms: u64) -> f64 {
        x_at(self.span, at_ms)
    }

    /// The y position of a value on a scale; values outside it are drawn at its ends.
    fn y(&self, scale: &Scale, v: f64) -> f64 {
        PLOT_BOTTOM - clean(v).min(scale.top) / scale.top * (PLOT_BOTTOM - self.plot_top)
    }

    /// The instants of the time axis's ticks and the step between them.
    fn time_ticks(&self) -> (Vec<u64>, u64) {
        let step = tick_step_ms(self.span);
        ((0..=self.span / step).map(|i| i * step).collect(), step)
    }
}

/// The XML declaration, the root element, the accessible title and the white background.
fn open_document(svg: &mut String, chart: &Chart<'_>) {
    let title = esc(&shorten(chart.title, WIDTH - 32.0, TITLE_EM));
    let _ = write!(
        svg,
        concat!(
            "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n",
            "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" ",
            "viewBox=\"0 0 {w} {h}\" role=\"img\" aria-label=\"{t}\" ",
            "font-family=\"sans-serif\" font-size=\"11\" fill=\"{text}\">\n",
            "<title>{t}</title>\n",
            "<rect class=\"background\" x=\"0\" y=\"0\" width=\"{w}\" height=\"{h}\" fill=\"#ffffff\"/>\n",
            "<text class=\"title\" x=\"16\" y=\"21\" font-size=\"15\" font-weight=\"bold\">{t}</text>\n",
        ),
        w = WIDTH,
        h = HEIGHT,
        t = title,
        text = COLOUR_TEXT,
    );
}

/// Light grid lines: vertical at the time ticks, horizontal at the left axis's ticks.
fn grid(svg: &mut String, f: &Frame<'_, '_>) {
    let _ = writeln!(
        svg,
        "<g class=\"grid\" stroke=\"{COLOUR_GRID}\" stroke-width=\"1\">"
    );
    for t in f.time_ticks().0 {
        let x = n(f.x(t));
        let (top, bottom) = (n(f.plot_top), n(PLOT_BOTTOM));
        let _ = writeln!(
            svg,
            "<line x1=\"{x}\" y1=\"{top}\" x2=\"{x}\" y2=\"{bottom}\"/>"
        );
    }
    for v in ticks(&f.left) {
        let (l, r, y) = (n(PLOT_LEFT), n(PLOT_RIGHT), n(f.y(&f.left, v)));
        let _ = writeln!(svg, "<line x1=\"{l}\" y1=\"{y}\" x2=\"{r}\" y2=\"{y}\"/>");
    }
    svg.push_str("</g>\n");
}

/// One translucent `rect.fault` per window across the plot's height, clipped to the time
/// axis, carrying the window's instants as `data-from-ms` and `data-until-ms`.
fn fault_bands(svg: &mut String, f: &Frame<'_, '_>) {
    svg.push_str("<g class=\"faults\">\n");
    for w in f.chart.windows {
        let until = w.until_ms.unwrap_or(f.span);
        let x = f.x(w.from_ms);
        let width = match w.band {
            Band::Network => (f.x(until) - x).max(0.0),
            _ => (f.x(until) - x).max(MIN_BAND_W),
        };
        let _ = writeln!(
            svg,
            concat!(
                "<rect class=\"fault\" data-band=\"{kind}\" data-from-ms=\"{from}\" data-until-ms=\"{until}\" ",
                "x=\"{x}\" y=\"{y}\" width=\"{width}\" height=\"{height}\" fill=\"{fill}\" ",
                "fill-opacity=\"0.28\"><title>{label}: {from_s}–{until_s} s</title></rect>",
            ),
            from = w.from_ms,
            until = until,
            x = n(x),
            y = n(f.plot_top),
            width = n(width),
            height = n(PLOT_BOTTOM - f.plot_top),
            fill = w.band.colour(),
            kind = w.band.name().0,
            label = esc(&fault_text(w)),
            from_s = seconds(w.from_ms),
            until_s = seconds(until),
        );
    }
    svg.push_str("</g>\n");
}

/// Delivered per second on the left axis: a line over a light area (a dot for one sample, a
/// note for none).
fn delivered_series(svg: &mut String, f: &Frame<'_, '_>) {
    let points: Vec<(f64, f64)> = f
        .samples
        .iter()
        .map(|s| (f.x(s.at_ms), f.y(&f.left, s.delivered_per_s)))
        .collect();
    match points.as_slice() {
        [] => {
            let _ = writeln!(
                svg,
                "<text class=\"no-samples\" x=\"{}\" y=\"{}\" text-anchor=\"middle\" fill=\"{COLOUR_MUTED}\" font-style=\"italic\">no samples</text>",
                n((PLOT_LEFT + PLOT_RIGHT) / 2.0),
                n((f.plot_top + PLOT_BOTTOM) / 2.0),
            );
        }
        [(x, y)] => {
            let (x, y) = (n(*x), n(*y));
            let _ = writeln!(
                svg,
                "<circle class=\"delivered\" cx=\"{x}\" cy=\"{y}\" r=\"2.5\" fill=\"{COLOUR_DELIVERED}\"/>"
            );
        }
        [first, .., last] => {
            let line: Vec<String> = points
                .iter()
                .map(|(x, y)| format!("{} {}", n(*x), n(*y)))
                .collect();
            let (x0, x1, bottom) = (n(first.0), n(last.0), n(PLOT_BOTTOM));
            let _ = writeln!(
                svg,
                concat!(
                    "<path class=\"delivered-area\" d=\"M{x0} {bottom} L{area} L{x1} {bottom} Z\" ",
                    "fill=\"{c}\" fill-opacity=\"0.13\" stroke=\"none\"/>\n",
                    "<path class=\"delivered\" d=\"M{line}\" fill=\"none\" stroke=\"{c}\" ",
                    "stroke-width=\"1.8\" stroke-linejoin=\"round\"/>",
                ),
                x0 = x0,
                x1 = x1,
                bottom = bottom,
                area = line.join(" L"),
                line = line.join(" L"),
                c = COLOUR_DELIVERED,
            );
        }
    }
}

/// The backlog on the right axis, and beside it what the source held unread.
fn backlog_series(svg: &mut String, f: &Frame<'_, '_>) {
    right_series(svg, f, |s| s.waiting, "backlog", COLOUR_BACKLOG, "none");
    if f.samples.iter().any(|s| s.unread.is_some()) {
        right_series(svg, f, |s| s.unread, "unread", COLOUR_UNREAD, "5 3");
    }
}

/// One series on the right axis: a line broken wherever it was not reported, a lone report
/// between gaps drawn as a dot (a zero-length segment with round caps).
fn right_series(
    svg: &mut String,
    f: &Frame<'_, '_>,
    value: impl Fn(&Sample) -> Option<u64>,
    class: &str,
    colour: &str,
    dash: &str,
) {
    let Some(scale) = &f.right else { return };
    let mut d = String::new();
    let mut run = 0usize;
    for s in &f.samples {
        match value(s) {
            Some(w) => {
                let cmd = if run == 0 { "M" } else { "L" };
                let _ = write!(d, "{cmd}{} {} ", n(f.x(s.at_ms)), n(f.y(scale, w as f64)));
                run += 1;
            }
            None => {
                if run == 1 {
                    d.push_str("h0 ");
                }
                run = 0;
            }
        }
    }
    if run == 1 {
        d.push_str("h0 ");
    }
    let dash = match dash {
        "none" => String::new(),
        d => format!("stroke-dasharray=\"{d}\" "),
    };
    let _ = writeln!(
        svg,
        concat!(
            "<path class=\"{}\" d=\"{}\" fill=\"none\" stroke=\"{}\" stroke-width=\"2\" ",
            "{}stroke-linejoin=\"round\" stroke-linecap=\"round\"/>",
        ),
        class,
        d.trim_end(),
        colour,
        dash,
    );
}

/// One `line.mark` per mark across the plot's height, carrying its kind as `data-kind`.
fn mark_lines(svg: &mut String, f: &Frame<'_, '_>) {
    svg.push_str("<g class=\"marks\">\n");
    for m in &f.marks {
        let (colour, dash) = mark_style(m.kind);
        let _ = writeln!(
            svg,
            concat!(
                "<line class=\"mark\" data-kind=\"{kind}\" data-at-ms=\"{at}\" x1=\"{x}\" y1=\"{top}\" ",
                "x2=\"{x}\" y2=\"{bottom}\" stroke=\"{colour}\" stroke-width=\"1.5\" stroke-dasharray=\"{dash}\">",
                "<title>{label} at {at_s} s</title></line>",
            ),
            kind = kind_name(m.kind),
            at = m.at_ms,
            x = n(f.x(m.at_ms)),
            top = n(f.plot_top),
            bottom = n(PLOT_BOTTOM),
            label = esc(&mark_text(m)),
            at_s = seconds(m.at_ms),
            colour = colour,
            dash = dash,
        );
    }
    svg.push_str("</g>\n");
}

/// The axis lines, their tick labels and their titles; the right axis only with a backlog.
fn axes(svg: &mut String, f: &Frame<'_, '_>) {
    let (l, r, t, b) = (n(PLOT_LEFT), n(PLOT_RIGHT), n(f.plot_top), n(PLOT_BOTTOM));
    let right_line = if f.right.is_some() {
        format!("<line x1=\"{r}\" y1=\"{t}\" x2=\"{r}\" y2=\"{b}\"/>")
    } else {
        String::new()
    };
    let _ = writeln!(
        svg,
        concat!(
            "<g class=\"axes\" stroke=\"{c}\" stroke-width=\"1\"><line x1=\"{l}\" y1=\"{b}\" x2=\"{r}\" y2=\"{b}\"/>",
            "<line x1=\"{l}\" y1=\"{t}\" x2=\"{l}\" y2=\"{b}\"/>{right_line}</g>",
        ),
        c = COLOUR_AXIS,
        l = l,
        r = r,
        t = t,
        b = b,
        right_line = right_line,
    );
    tick_labels(svg, f);
    axis_titles(svg, f);
}

/// The time axis's ticks and labels, and each value axis's labels.
fn tick_labels(svg: &mut String, f: &Frame<'_, '_>) {
    let b = n(PLOT_BOTTOM);
    let (instants, step) = f.time_ticks();
    let _ = writeln!(
        svg,
        "<g class=\"x-ticks\" text-anchor=\"middle\" fill=\"{COLOUR_MUTED}\">"
    );
    for at in instants {
        let x = n(f.x(at));
        let label = if step.is_multiple_of(1000) {
            (at / 1000).to_string()
        } else {
            seconds(at)
        };
        let (b4, ty) = (n(PLOT_BOTTOM + 4.0), n(PLOT_BOTTOM + 16.0));
        let _ = writeln!(
            svg,
            "<line x1=\"{x}\" y1=\"{b}\" x2=\"{x}\" y2=\"{b4}\" stroke=\"{COLOUR_AXIS}\"/><text x=\"{x}\" y=\"{ty}\">{label}</text>",
        );
    }
    svg.push_str("</g>\n");
    let _ = writeln!(
        svg,
        "<g class=\"left-ticks\" text-anchor=\"end\" fill=\"{COLOUR_DELIVERED}\">"
    );
    for v in ticks(&f.left) {
        let _ = writeln!(
            svg,
            "<text x=\"{}\" y=\"{}\">{}</text>",
            n(PLOT_LEFT - 6.0),
            n(f.y(&f.left, v) + 4.0),
            fmt_num(v)
        );
    }
    svg.push_str("</g>\n");
    if let Some(scale) = &f.right {
        let _ = writeln!(
            svg,
            "<g class=\"right-ticks\" text-anchor=\"start\" fill=\"{COLOUR_BACKLOG}\">"
        );
        for v in ticks(scale) {
            let _ = writeln!(
                svg,
                "<text x=\"{}\" y=\"{}\">{}</text>",
                n(PLOT_RIGHT + 6.0),
                n(f.y(scale, v) + 4.0),
                fmt_num(v)
            );
        }
        svg.push_str("</g>\n");
    }
}

/// The three axis titles (the right one only with a backlog).
fn axis_titles(svg: &mut String, f: &Frame<'_, '_>) {
    let mid_y = n((f.plot_top + PLOT_BOTTOM) / 2.0);
    let _ = writeln!(
        svg,
        concat!(
            "<text class=\"axis-title\" x=\"{x}\" y=\"{y}\" text-anchor=\"middle\" fill=\"{c}\">",
            "time since the drill started (s)</text>",
        ),
        x = n((PLOT_LEFT + PLOT_RIGHT) / 2.0),
        y = n(PLOT_BOTTOM + 33.0),
        c = COLOUR_MUTED,
    );
    let _ = writeln!(
        svg,
        concat!(
            "<text class=\"axis-title\" x=\"18\" y=\"{y}\" transform=\"rotate(-90 18 {y})\" ",
            "text-anchor=\"middle\" fill=\"{c}\">delivered (records/s)</text>",
        ),
        y = mid_y,
        c = COLOUR_DELIVERED,
    );
    if f.right.is_some() {
        let _ = writeln!(
            svg,
            concat!(
                "<text class=\"axis-title\" x=\"{x}\" y=\"{y}\" transform=\"rotate(90 {x} {y})\" ",
                "text-anchor=\"middle\" fill=\"{c}\">backlog (records waiting)</text>",
            ),
            x = n(WIDTH - 14.0),
            y = mid_y,
            c = COLOUR_BACKLOG,
        );
    }
}

/// The fault labels in their lanes above the plot, each over a bar spanning its window.
fn fault_label_lanes(svg: &mut String, f: &Frame<'_, '_>) {
    svg.push_str("<g class=\"fault-labels\">\n");
    for label in &f.faults {
        let lane_top = HEADER_TOP + label.lane as f64 * FAULT_LANE_H;
        if label.bar_w > 0.0 {
            let _ = write!(
                svg,
                "<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"3\" fill=\"{}\"/>",
                n(label.bar_x),
                n(lane_top + 11.5),
                n(label.bar_w),
                label.colour,
            );
        }
        let _ = writeln!(
            svg,
            "<text x=\"{}\" y=\"{}\" fill=\"{COLOUR_FAULT_TEXT}\">{}</text>",
            n(label.text_x),
            n(lane_top + 9.0),
            esc(&label.text),
        );
    }
    svg.push_str("</g>\n");
}

/// The mark labels in lanes inside the top of the plot, right of their line (left of it near
/// the right edge), haloed in white so the lines and series under them stay readable.
fn mark_labels(svg: &mut String, f: &Frame<'_, '_>) {
    svg.push_str(concat!(
        "<g class=\"mark-labels\" font-size=\"10\" stroke=\"#ffffff\" stroke-width=\"3\" ",
        "paint-order=\"stroke\" stroke-linejoin=\"round\">\n",
    ));
    let mut lanes = Lanes::new(MAX_MARK_LANES);
    for m in &f.marks {
        let x = f.x(m.at_ms);
        let text = shorten(&mark_text(m), (PLOT_RIGHT - PLOT_LEFT) / 2.0, 10.0);
        let w = text_w(&text, 10.0);
        let (left, anchor, tx) = if x + 3.0 + w <= PLOT_RIGHT {
            (x, "start", x + 3.0)
        } else {
            (x - 3.0 - w, "end", x - 3.0)
        };
        let lane = lanes.place(left, left + w + 3.0);
        let _ = writeln!(
            svg,
            "<text x=\"{}\" y=\"{}\" text-anchor=\"{anchor}\" fill=\"{}\">{}</text>",
            n(tx),
            n(f.plot_top + 11.0 + lane as f64 * MARK_LANE_H),
            mark_style(m.kind).0,
            esc(&text),
        );
    }
    svg.push_str("</g>\n");
}

/// The end of the x axis in milliseconds: the duration, or for a zero duration the latest
/// instant the chart mentions; never 0.
fn span_ms(chart: &Chart<'_>) -> u64 {
    if chart.duration_ms > 0 {
        return chart.duration_ms;
    }
    let samples = chart.samples.iter().map(|s| s.at_ms);
    let marks = chart.marks.iter().map(|m| m.at_ms);
    let windows = chart
        .windows
        .iter()
        .flat_map(|w| [Some(w.from_ms), w.until_ms])
        .flatten();
    samples
        .chain(marks)
        .chain(windows)
        .max()
        .unwrap_or(0)
        .max(1)
}

/// A value fit to draw: NaN and negatives are 0, huge values and infinity are [`VALUE_CAP`].
fn clean(v: f64) -> f64 {
    if v.is_nan() {
        0.0
    } else {
        v.clamp(0.0, VALUE_CAP)
    }
}

/// A time-axis step giving 5–12 ticks (as far as the span allows): 0.1, 0.2, 0.5, 1, 2, 5, 10,
/// 15, 30 s, 1, 2, 5, 10, 15, 30 min, 1, 2, 3, 6, 12 h, then whole days.
fn tick_step_ms(span: u64) -> u64 {
    const STEPS: [u64; 20] = [
        100, 200, 500, 1_000, 2_000, 5_000, 10_000, 15_000, 30_000, 60_000, 120_000, 300_000,
        600_000, 900_000, 1_800_000, 3_600_000, 7_200_000, 10_800_000, 21_600_000, 43_200_000,
    ];
    for step in STEPS {
        if span / step < 12 {
            return step;
        }
    }
    let day = 86_400_000;
    (span / 10).div_ceil(day).max(1) * day
}

/// The top and step of a value axis that holds `max` with a little headroom: 1, 2, 2.5 or 5
/// times a power of ten, about 4–6 ticks. An empty axis runs 0–5.
fn nice_axis(max: f64) -> Scale {
    let max = clean(max);
    if max <= 0.0 {
        return Scale {
            top: 5.0,
            step: 1.0,
        };
    }
    let raw = max / 4.0;
    let mag = 10f64.powf(raw.log10().floor());
    let step = [1.0, 2.0, 2.5, 5.0, 10.0]
        .iter()
        .map(|m| m * mag)
        .find(|s| *s >= raw)
        .unwrap_or(10.0 * mag);
    let mut top = (max / step).ceil() * step;
    if top < max * 1.08 {
        top += step;
    }
    Scale { top, step }
}

/// The tick values of a value axis: 0, step, … up to top.
fn ticks(scale: &Scale) -> Vec<f64> {
    let count = (scale.top / scale.step).round() as usize;
    (0..=count.min(20)).map(|i| i as f64 * scale.step).collect()
}

/// A tick value, short: `2500`, `0.25`, `12k`, `1.5M`.
fn fmt_num(v: f64) -> String {
    let (_, div, suffix) = [
        (1e12, 1e12, "T"),
        (1e9, 1e9, "G"),
        (1e6, 1e6, "M"),
        (1e4, 1e3, "k"),
    ]
    .into_iter()
    .find(|(from, _, _)| v >= *from)
    .unwrap_or((0.0, 1.0, ""));
    format!("{}{}", n(v / div), suffix)
}

/// A coordinate or value with at most two decimals and no trailing zeros.
fn n(v: f64) -> String {
    let s = format!("{:.2}", if v.is_finite() { v } else { 0.0 });
    let s = if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.')
    } else {
        &s
    };
    if s == "-0" {
        "0".to_string()
    } else {
        s.to_string()
    }
}

/// Milliseconds as seconds with one decimal, e.g. `20.0`.
fn seconds(ms: u64) -> String {
    format!("{}.{}", ms / 1000, (ms % 1000) / 100)
}

/// Text made safe for XML: the five special characters escaped, control characters (which
/// XML 1.0 forbids) replaced, line breaks turned into spaces.
fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            '\n' | '\r' | '\t' => out.push(' '),
            c if (c as u32) < 0x20 || c == '\u{FFFE}' || c == '\u{FFFF}' => out.push('\u{FFFD}'),
            c => out.push(c),
        }
    }
    out
}

/// Estimated width of a text at this font size, by rough sans-serif character classes (slightly
/// generous, so laid-out labels keep clear of each other rather than touch).
fn text_w(s: &str, font_size: f64) -> f64 {
    let ems: f64 = s
        .chars()
        .map(|c| match c {
            'i' | 'j' | 'l' | '.' | ',' | ':' | ';' | '\'' | '|' | '!' => 0.28,
            ' ' | 'f' | 't' | 'r' | 'I' | '(' | ')' | '[' | ']' | '/' | '-' => 0.36,
            'm' | 'w' | 'M' | 'W' | '@' | '%' => 0.86,
            'A'..='Z' | '&' | '–' | '—' | '…' | '→' => 0.7,
            c if c.is_ascii() => 0.56,
            _ => 1.0,
        })
        .sum();
    ems * font_size
}

/// The text cut to fit `max_width` at this font size (by [`text_w`]), with an ellipsis when cut.
fn shorten(s: &str, max_width: f64, font_size: f64) -> String {
    if text_w(s, font_size) <= max_width {
        return s.to_string();
    }
    let budget = max_width - text_w("…", font_size);
    let mut used = 0.0;
    let mut t = String::new();
    for c in s.chars() {
        let w = text_w(c.encode_utf8(&mut [0; 4]), font_size);
        if used + w > budget {
            break;
        }
        used += w;
        t.push(c);
    }
    t.push('…');
    t
}

/// Greedy lane assignment for labels: each label goes in the first lane where it does not
/// overlap the previous label; when every lane is taken, in the lane that frees up first.
struct Lanes {
    /// The right end of the last label in each lane opened so far.
    ends: Vec<f64>,
    /// How many lanes may be opened.
    max: usize,
}

impl Lanes {
    /// No lanes yet, at most `max` of them (at least one).
    fn new(max: usize) -> Self {
        Lanes {
            ends: Vec::new(),
            max: max.max(1),
        }
    }

    /// The lane for a label spanning `left..right` (x positions), which it then occupies.
    fn place(&mut self, left: f64, right: f64) -> usize {
        const GAP: f64 = 6.0;
        let lane = match self.ends.iter().position(|end| *end + GAP <= left) {
            Some(i) => i,
            None if self.ends.len() < self.max => {
                self.ends.push(f64::NEG_INFINITY);
                self.ends.len() - 1
            }
            None => (0..self.ends.len())
                .min_by(|a, b| self.ends[*a].total_cmp(&self.ends[*b]))
                .unwrap_or(0),
        };
        self.ends[lane] = self.ends[lane].max(right);
        lane
    }
}

/// Where one fault window's label goes.
struct FaultLabel {
    /// Which lane (0 = top) it sits in.
    lane: usize,
    /// The label, shortened to fit the plot's width.
    text: String,
    /// Where its text starts.
    text_x: f64,
    /// Where the bar under it starts (the band's x).
    bar_x: f64,
    /// The bar's width (the band's width).
    bar_w: f64,
    /// The bar's colour (the band's).
    colour: &'static str,
}

/// The labels of the windows that start on the axis, laid out in lanes so that overlapping
/// windows (or labels longer than their band) get separate lines.
fn fault_labels(chart: &Chart<'_>, span: u64) -> Vec<FaultLabel> {
    let mut windows: Vec<&Window> = chart.windows.iter().filter(|w| w.from_ms < span).collect();
    windows.sort_by_key(|w| w.from_ms);
    let mut lanes = Lanes::new(MAX_FAULT_LANES);
    windows
        .into_iter()
        .map(|w| {
            let bar_x = x_at(span, w.from_ms);
            let bar_w = (x_at(span, w.until_ms.unwrap_or(span)) - bar_x).max(0.0);
            let text = shorten(&fault_text(w), PLOT_RIGHT - PLOT_LEFT, 11.0);
            let tw = text_w(&text, 11.0);
            let text_x = (bar_x + 1.0).min(PLOT_RIGHT - tw).max(PLOT_LEFT);
            let lane = lanes.place(bar_x.min(text_x), (bar_x + bar_w).max(text_x + tw));
            FaultLabel {
                lane,
                text,
                text_x,
                bar_x,
                bar_w,
                colour: w.band.colour(),
            }
        })
        .collect()
}

/// A window's label, or `fault` when it has none.
fn fault_text(w: &Window) -> String {
    let t = w.label.trim();
    if t.is_empty() {
        "fault".to_string()
    } else {
        t.to_string()
    }
}

/// A mark's label, or its kind's name when it has none.
fn mark_text(m: &Mark) -> String {
    let t = m.label.trim();
    if !t.is_empty() {
        return t.to_string();
    }
    match m.kind {
        MarkKind::Restart => "restart",
        MarkKind::Kill => "kill",
        MarkKind::FirstDelivery => "first delivery",
        MarkKind::Drained => "drained",
    }
    .to_string()
}

/// The `data-kind` value of a mark.
fn kind_name(kind: MarkKind) -> &'static str {
    match kind {
        MarkKind::Restart => "restart",
        MarkKind::Kill => "kill",
        MarkKind::FirstDelivery => "first_delivery",
        MarkKind::Drained => "drained",
    }
}

/// Colour and dash pattern of a mark: dark red for the engine stopping and starting, green for
/// deliveries resuming and the backlog draining.
fn mark_style(kind: MarkKind) -> (&'static str, &'static str) {
    match kind {
        MarkKind::Kill => (COLOUR_STOP, "6 3"),
        MarkKind::Restart => (COLOUR_STOP, "2 2"),
        MarkKind::FirstDelivery => (COLOUR_GO, "2 2"),
        MarkKind::Drained => (COLOUR_GO, "6 3"),
    }
}

/// The legend, one centred row at the bottom: only the things the chart shows, and a note
/// when the backlog was not reported.
fn legend(svg: &mut String, f: &Frame<'_, '_>) {
    let chart = f.chart;
    enum Swatch {
        Line(&'static str, &'static str),
        Band(Band),
        None,
    }
    let mut items: Vec<(Swatch, &str)> = vec![(
        Swatch::Line(COLOUR_DELIVERED, "none"),
        "delivered per second (left axis)",
    )];
    if f.right.is_some() {
        items.push((
            Swatch::Line(COLOUR_BACKLOG, "none"),
            "backlog waiting in the engine (right axis)",
        ));
    } else {
        items.push((Swatch::None, "backlog: not reported"));
    }
    if f.samples.iter().any(|s| s.unread.is_some()) {
        items.push((
            Swatch::Line(COLOUR_UNREAD, "5 3"),
            "unread at the source (right axis)",
        ));
    }
    for band in [Band::Network, Band::Disk, Band::Clock] {
        if chart.windows.iter().any(|w| w.band == band) {
            items.push((Swatch::Band(band), band.name().1));
        }
    }
    let has = |kinds: &[MarkKind]| chart.marks.iter().any(|m| kinds.contains(&m.kind));
    if has(&[MarkKind::Kill, MarkKind::Restart]) {
        items.push((Swatch::Line(COLOUR_STOP, "4 2"), "kill / restart"));
    }
    if has(&[MarkKind::FirstDelivery, MarkKind::Drained]) {
        items.push((Swatch::Line(COLOUR_GO, "4 2"), "first delivery / drained"));
    }

    const SWATCH: f64 = 18.0;
    const PAD: f64 = 5.0;
    const SPACING: f64 = 20.0;
    let width_of = |(swatch, text): &(Swatch, &str)| {
        let sw = if matches!(swatch, Swatch::None) {
            0.0
        } else {
            SWATCH + PAD
        };
        sw + text_w(text, 11.0)
    };
    let total: f64 = items.iter().map(width_of).sum::<f64>() + SPACING * (items.len() - 1) as f64;
    let mut x = ((WIDTH - total) / 2.0).max(8.0);
    let y = HEIGHT - 12.0;
    svg.push_str("<g class=\"legend\">\n");
    for item in &items {
        let (swatch, text) = item;
        let mut tx = x + SWATCH + PAD;
        match swatch {
            Swatch::Line(colour, dash) => {
                let _ = write!(
                    svg,
                    "<line x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"{}\" stroke-width=\"2\" stroke-dasharray=\"{}\"/>",
                    n(x),
                    n(y - 4.0),
                    n(x + SWATCH),
                    n(y - 4.0),
                    colour,
                    dash,
                );
            }
            Swatch::Band(band) => {
                let _ = write!(
                    svg,
                    "<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"10\" fill=\"{}\" fill-opacity=\"0.5\"/>",
                    n(x),
                    n(y - 9.0),
                    n(SWATCH),
                    band.colour(),
                );
            }
            Swatch::None => tx = x,
        }
        let style = if matches!(swatch, Swatch::None) {
            " font-style=\"italic\""
        } else {
            ""
        };
        let _ = writeln!(
            svg,
            "<text x=\"{}\" y=\"{}\" fill=\"{}\"{}>{}</text>",
            n(tx),
            n(y),
            COLOUR_MUTED,
            style,
            esc(text)
        );
        x += width_of(item) + SPACING;
    }
    svg.push_str("</g>\n");
}

/// The timeline chart: delivered per second and backlog, fault windows shaded, engine and
/// broker restarts, and each recovery's first delivery and drain marked.
pub fn timeline(report: &crate::report::Report) -> String {
    let samples: Vec<Sample> = report
        .series
        .iter()
        .map(|p| Sample {
            at_ms: p.at_ms,
            delivered_per_s: p.delivered as f64,
            waiting: p.waiting,
            unread: p.unread,
        })
        .collect();
    let mut windows = Vec::new();
    let mut marks = Vec::new();
    for f in &report.faults {
        let band = match &f.target {
            t if t.is_network() || t.is_source_link() => Some(Band::Network),
            crate::runner::events::FaultTarget::EngineDisk => Some(Band::Disk),
            crate::runner::events::FaultTarget::EngineClock => Some(Band::Clock),
            _ => None,
        };
        if let Some(band) = band {
            windows.push(Window {
                from_ms: f.at_ms,
                until_ms: f.until_ms,
                label: f.label(),
                band,
            });
        } else {
            marks.push(Mark {
                at_ms: f.at_ms,
                kind: MarkKind::Kill,
                label: format!("{} {}", f.target, f.what()),
            });
            // An instant (a source rotated, cut, removed) has nothing to come back from.
            if let Some(until) = f.until_ms.filter(|u| *u > f.at_ms) {
                marks.push(Mark {
                    at_ms: until,
                    kind: MarkKind::Restart,
                    label: format!("{} back", f.target),
                });
            }
        }
    }
    let mut seen = std::collections::HashSet::new();
    for r in &report.recovery {
        // Overlapping faults share one heal: mark it once.
        if !seen.insert(r.heal_ms) {
            continue;
        }
        if let Some(at) = r.first_delivery_ms {
            marks.push(Mark {
                at_ms: at,
                kind: MarkKind::FirstDelivery,
                label: format!("first delivery +{} ms", at.saturating_sub(r.heal_ms)),
            });
        }
        if let Some(at) = r.drained_ms {
            marks.push(Mark {
                at_ms: at,
                kind: MarkKind::Drained,
                label: format!("drained +{} ms", at.saturating_sub(r.heal_ms)),
            });
        }
    }
    let title = format!(
        "{} — {} — {}",
        report.scenario,
        report.verdict.word(),
        report.headline
    );
    render(&Chart {
        title: &title,
        duration_ms: report.duration_ms,
        samples: &samples,
        windows: &windows,
        marks: &marks,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Owned data for a chart, so tests can build one and borrow it.
    struct Data {
        title: String,
        duration_ms: u64,
        samples: Vec<Sample>,
        windows: Vec<Window>,
        marks: Vec<Mark>,
    }

    impl Data {
        fn chart(&self) -> Chart<'_> {
            Chart {
                title: &self.title,
                duration_ms: self.duration_ms,
                samples: &self.samples,
                windows: &self.windows,
                marks: &self.marks,
            }
        }
    }

    /// A chart with nothing in it.
    fn empty(duration_ms: u64) -> Data {
        Data {
            title: "drill".into(),
            duration_ms,
            samples: vec![],
            windows: vec![],
            marks: vec![],
        }
    }

    /// A window in whole seconds.
    fn window(from_s: u64, until_s: Option<u64>, label: &str) -> Window {
        Window {
            from_ms: from_s * 1000,
            until_ms: until_s.map(|u| u * 1000),
            label: label.into(),
            band: Band::Network,
        }
    }

    /// A mark in whole seconds.
    fn mark(at_s: u64, kind: MarkKind, label: &str) -> Mark {
        Mark {
            at_ms: at_s * 1000,
            kind,
            label: label.into(),
        }
    }

    /// A realistic 120 s drill at 100 records/s: the link swallows everything from 20 s to 40 s
    /// (the engine is killed at 30 s and restarted at 32 s, not reporting in between), then
    /// refuses connections from 60 s to 75 s; after each heal the engine catches up at up to
    /// 400 records/s until its backlog drains.
    fn example() -> Data {
        let faults = [(20, 40), (60, 75)];
        let mut samples = Vec::new();
        let mut marks = vec![
            mark(30, MarkKind::Kill, "kill engine"),
            mark(32, MarkKind::Restart, "restart engine"),
        ];
        let mut backlog: u64 = 0;
        let mut since_heal: Option<u64> = None;
        for t in 0..=120u64 {
            let faulted = faults.iter().any(|&(a, b)| t > a && t <= b);
            let delivered = if faulted {
                backlog += 100;
                0
            } else if backlog > 0 {
                let d = (backlog + 100).min(400);
                backlog = backlog + 100 - d;
                if since_heal.take().is_some() {
                    marks.push(mark(t, MarkKind::FirstDelivery, "first delivery"));
                }
                if backlog == 0 {
                    marks.push(mark(t, MarkKind::Drained, "drained"));
                }
                d
            } else {
                100
            };
            if faults.iter().any(|&(_, b)| t == b) {
                since_heal = Some(t);
            }
            let engine_down = (30..32).contains(&t);
            samples.push(Sample {
                at_ms: t * 1000,
                delivered_per_s: delivered as f64,
                waiting: if engine_down { None } else { Some(backlog) },
                unread: None,
            });
        }
        Data {
            title: "mqtt → kafka: link faults with an engine kill".into(),
            duration_ms: 120_000,
            samples,
            windows: vec![
                window(20, Some(40), "link mqtt swallow both"),
                window(60, Some(75), "link mqtt refuse both"),
            ],
            marks,
        }
    }

    /// The document, or a failure showing why it is not XML.
    fn parse(svg: &str) -> roxmltree::Document<'_> {
        roxmltree::Document::parse(svg).unwrap_or_else(|e| panic!("not XML: {e}\n{svg}"))
    }

    /// The elements with this `class`, in document order.
    fn by_class<'a, 'i>(
        doc: &'a roxmltree::Document<'i>,
        class: &str,
    ) -> Vec<roxmltree::Node<'a, 'i>> {
        doc.descendants()
            .filter(|n| n.attribute("class") == Some(class))
            .collect()
    }

    /// A numeric attribute.
    fn num(node: &roxmltree::Node<'_, '_>, attr: &str) -> f64 {
        node.attribute(attr)
            .unwrap_or_else(|| panic!("no {attr}"))
            .parse()
            .expect("a number")
    }

    /// The contents of every `<text>` element.
    fn texts(doc: &roxmltree::Document<'_>) -> Vec<String> {
        doc.descendants()
            .filter(|n| n.has_tag_name("text"))
            .filter_map(|n| n.text())
            .map(str::to_string)
            .collect()
    }

    #[test]
    fn document_is_a_fixed_size_svg_with_a_white_background() {
        let data = example();
        let svg = render(&data.chart());
        let doc = parse(&svg);
        let root = doc.root_element();
        assert_eq!(root.tag_name().name(), "svg");
        assert_eq!(
            root.tag_name().namespace(),
            Some("http://www.w3.org/2000/svg")
        );
        assert_eq!(root.attribute("width"), Some("960"));
        assert_eq!(root.attribute("height"), Some("360"));
        assert_eq!(root.attribute("font-family"), Some("sans-serif"));
        let bg = &by_class(&doc, "background")[0];
        assert_eq!(bg.attribute("fill"), Some("#ffffff"));
        assert!(
            !svg.contains("<script") && !svg.contains("href"),
            "self-contained"
        );
    }

    #[test]
    fn one_fault_rect_per_window_at_its_times() {
        let data = example();
        let chart = data.chart();
        let svg = render(&chart);
        let doc = parse(&svg);
        let rects = by_class(&doc, "fault");
        assert_eq!(rects.len(), 2);
        for (rect, (from, until)) in rects.iter().zip([(20_000, 40_000), (60_000, 75_000)]) {
            assert_eq!(rect.tag_name().name(), "rect");
            assert_eq!(
                rect.attribute("data-from-ms"),
                Some(from.to_string().as_str())
            );
            assert_eq!(
                rect.attribute("data-until-ms"),
                Some(until.to_string().as_str())
            );
            assert!((num(rect, "x") - x_of(&chart, from)).abs() < 0.01);
            assert!((num(rect, "width") - (x_of(&chart, until) - x_of(&chart, from))).abs() < 0.01);
        }
        // The axis really runs 0..120 s across the plot: 30 s is a quarter of the way.
        let quarter = x_of(&chart, 0) + (x_of(&chart, 120_000) - x_of(&chart, 0)) / 4.0;
        assert!((x_of(&chart, 30_000) - quarter).abs() < 1e-9);
        let labels = texts(&doc);
        assert!(labels.iter().any(|t| t == "link mqtt swallow both"));
        assert!(labels.iter().any(|t| t == "link mqtt refuse both"));
    }

    #[test]
    fn open_windows_run_to_the_end_and_late_windows_are_clipped() {
        let mut data = empty(60_000);
        data.windows = vec![
            window(50, None, "proxy down"),
            window(40, Some(90), "past the end"),
            window(70, Some(80), "after the end"),
            window(30, Some(20), "backwards"),
        ];
        let chart = data.chart();
        let svg = render(&chart);
        let doc = parse(&svg);
        let rects = by_class(&doc, "fault");
        assert_eq!(rects.len(), 4);
        assert_eq!(rects[0].attribute("data-until-ms"), Some("60000"));
        let right = x_of(&chart, 60_000);
        for rect in &rects {
            let (x, w) = (num(rect, "x"), num(rect, "width"));
            assert!(
                w >= 0.0 && x + w <= right + 0.01,
                "{x} + {w} beyond {right}"
            );
        }
        assert!((num(&rects[0], "width") - (right - x_of(&chart, 50_000))).abs() < 0.01);
        assert!((num(&rects[1], "width") - (right - x_of(&chart, 40_000))).abs() < 0.01);
        assert_eq!(num(&rects[2], "width"), 0.0);
        assert_eq!(num(&rects[3], "width"), 0.0);
    }

    #[test]
    fn disk_and_clock_faults_get_bands_of_their_own() {
        let mut data = empty(120_000);
        data.windows = vec![
            window(20, Some(40), "link mqtt refuse both"),
            Window {
                band: Band::Disk,
                ..window(
                    30,
                    Some(30),
                    "engine disk I/O error: fsync on *.log fails with EIO",
                )
            },
            Window {
                band: Band::Clock,
                ..window(50, Some(50), "engine clock wall clock jumps +2h")
            },
        ];
        let svg = render(&data.chart());
        let doc = parse(&svg);
        let band = |kind: &str| {
            by_class(&doc, "fault")
                .into_iter()
                .find(|n| n.attribute("data-band") == Some(kind))
                .unwrap_or_else(|| panic!("no {kind} band in {svg}"))
        };
        assert_eq!(band("network").attribute("fill"), Some(COLOUR_FAULT));
        for (class, colour) in [("disk", COLOUR_DISK), ("clock", COLOUR_CLOCK)] {
            let b = band(class);
            assert_eq!(b.attribute("fill"), Some(colour));
            // An instant is drawn as a thin band, not as nothing.
            let w: f64 = b.attribute("width").unwrap().parse().unwrap();
            assert!(w >= MIN_BAND_W, "{class}: width {w}");
        }
        for legend in ["fault in force", "disk fault", "clock jump"] {
            assert!(
                svg.contains(&format!(">{legend}</text>")),
                "{legend}: {svg}"
            );
        }
    }

    #[test]
    fn overlapping_windows_get_labels_on_separate_lines() {
        let mut data = empty(120_000);
        data.windows = vec![
            window(20, Some(60), "link mqtt swallow both"),
            window(30, Some(50), "link kafka refuse both"),
            window(80, Some(100), "proxy down"),
        ];
        let svg = render(&data.chart());
        let doc = parse(&svg);
        let labels: Vec<_> = by_class(&doc, "fault-labels")[0]
            .children()
            .filter(|n| n.has_tag_name("text"))
            .collect();
        assert_eq!(labels.len(), 3);
        let y = |i: usize| num(&labels[i], "y");
        assert!(
            (y(0) - y(1)).abs() >= FAULT_LANE_H - 0.01,
            "overlapping windows share a line"
        );
        assert_eq!(
            y(2),
            y(0),
            "a window clear of the others goes back to the first line"
        );
    }

    #[test]
    fn marks_carry_their_kind_and_instant() {
        let data = example();
        let chart = data.chart();
        let svg = render(&chart);
        let doc = parse(&svg);
        let lines = by_class(&doc, "mark");
        assert_eq!(lines.len(), data.marks.len());
        let kinds: Vec<_> = lines
            .iter()
            .map(|l| {
                (
                    l.attribute("data-kind").unwrap(),
                    num(l, "data-at-ms") as u64,
                )
            })
            .collect();
        assert_eq!(
            kinds,
            [
                ("kill", 30_000),
                ("restart", 32_000),
                ("first_delivery", 41_000),
                ("drained", 47_000),
                ("first_delivery", 76_000),
                ("drained", 80_000)
            ]
        );
        for l in &lines {
            assert_eq!(l.tag_name().name(), "line");
            assert!((num(l, "x1") - x_of(&chart, num(l, "data-at-ms") as u64)).abs() < 0.01);
        }
        let labels = texts(&doc);
        for label in ["kill engine", "restart engine", "first delivery", "drained"] {
            assert!(labels.iter().any(|t| t == label), "{label}");
        }
    }

    #[test]
    fn text_is_escaped() {
        let mut data = empty(10_000);
        data.title = "a <b> & \"c\" 'd' \u{1}".into();
        data.windows = vec![window(1, Some(2), "</text><script>&")];
        data.marks = vec![mark(3, MarkKind::Kill, "x<y&z>\"")];
        let svg = render(&data.chart());
        let doc = parse(&svg);
        let title = doc.descendants().find(|n| n.has_tag_name("title")).unwrap();
        assert_eq!(title.text(), Some("a <b> & \"c\" 'd' \u{FFFD}"));
        let labels = texts(&doc);
        assert!(labels.iter().any(|t| t == "</text><script>&"));
        assert!(labels.iter().any(|t| t == "x<y&z>\""));
        assert!(!svg.contains("<script"));
    }

    #[test]
    fn empty_input_renders_a_valid_document() {
        for duration in [0, 1, 60_000] {
            let data = empty(duration);
            let svg = render(&data.chart());
            let doc = parse(&svg);
            assert!(by_class(&doc, "fault").is_empty());
            assert!(by_class(&doc, "mark").is_empty());
            assert!(by_class(&doc, "delivered").is_empty());
            assert!(by_class(&doc, "backlog").is_empty());
            assert!(texts(&doc).iter().any(|t| t == "backlog: not reported"));
            assert_eq!(by_class(&doc, "no-samples").len(), 1);
        }
    }

    #[test]
    fn zero_duration_runs_the_axis_to_the_latest_instant() {
        let mut data = example();
        data.duration_ms = 0;
        let chart = data.chart();
        assert_eq!(x_of(&chart, 120_000), PLOT_RIGHT);
        assert_eq!(x_of(&chart, 60_000), (PLOT_LEFT + PLOT_RIGHT) / 2.0);
        let svg = render(&chart);
        parse(&svg);
    }

    #[test]
    fn waiting_never_reported_omits_the_backlog_series() {
        let mut data = example();
        for s in &mut data.samples {
            s.waiting = None;
        }
        let svg = render(&data.chart());
        let doc = parse(&svg);
        assert!(by_class(&doc, "backlog").is_empty());
        assert!(by_class(&doc, "right-ticks").is_empty());
        assert_eq!(by_class(&doc, "delivered").len(), 1);
        let labels = texts(&doc);
        assert!(labels.iter().any(|t| t == "backlog: not reported"));
        assert!(!labels.iter().any(|t| t.contains("right axis")));
    }

    #[test]
    fn unreported_waiting_breaks_the_backlog_line() {
        let data = example();
        let svg = render(&data.chart());
        let doc = parse(&svg);
        let backlog = by_class(&doc, "backlog");
        assert_eq!(backlog.len(), 1);
        let d = backlog[0].attribute("d").unwrap();
        assert_eq!(
            d.matches('M').count(),
            2,
            "one gap (the engine down 30–32 s): {d}"
        );
        assert!(texts(&doc).iter().any(|t| t.starts_with("backlog waiting")));

        // A lone report between gaps is still drawn (as a dot).
        let mut data = empty(5_000);
        data.samples = (0..=5)
            .map(|t| Sample {
                at_ms: t * 1000,
                delivered_per_s: 1.0,
                waiting: (t == 2).then_some(7),
                unread: None,
            })
            .collect();
        let svg = render(&data.chart());
        let doc = parse(&svg);
        let d = by_class(&doc, "backlog")[0]
            .attribute("d")
            .unwrap()
            .to_string();
        assert!(d.starts_with('M') && d.ends_with("h0"), "{d}");
    }

    #[test]
    fn what_the_source_held_unread_is_a_dashed_line_beside_the_backlog() {
        let data = example();
        let svg_without = render(&data.chart());
        let doc_without = parse(&svg_without);
        assert!(by_class(&doc_without, "unread").is_empty());
        assert!(
            !texts(&doc_without)
                .iter()
                .any(|t| t.starts_with("unread at the source"))
        );
        let mut data = empty(5_000);
        data.samples = (0..=5)
            .map(|t| Sample {
                at_ms: t * 1000,
                delivered_per_s: 1.0,
                waiting: Some(1),
                unread: Some(100 * t),
            })
            .collect();
        let svg = render(&data.chart());
        let doc = parse(&svg);
        let unread = by_class(&doc, "unread");
        assert_eq!(unread.len(), 1, "{svg}");
        assert_eq!(unread[0].attribute("stroke-dasharray"), Some("5 3"));
        assert_eq!(unread[0].attribute("d").unwrap().matches('L').count(), 5);
        assert!(
            texts(&doc)
                .iter()
                .any(|t| t.starts_with("unread at the source"))
        );
    }

    #[test]
    fn degenerate_values_never_panic() {
        let odd = [
            f64::NAN,
            f64::INFINITY,
            f64::NEG_INFINITY,
            -5.0,
            1e300,
            0.0,
            f64::MIN_POSITIVE,
        ];
        for (i, rate) in odd.into_iter().enumerate() {
            let mut data = empty(10_000);
            data.samples = vec![
                Sample {
                    at_ms: 5_000,
                    delivered_per_s: rate,
                    waiting: Some(u64::MAX),
                    unread: None,
                },
                Sample {
                    at_ms: 1_000,
                    delivered_per_s: 3.0,
                    waiting: Some(i as u64),
                    unread: None,
                },
                Sample {
                    at_ms: u64::MAX,
                    delivered_per_s: 1.0,
                    waiting: None,
                    unread: None,
                },
            ];
            data.windows = vec![
                window(0, Some(0), ""),
                Window {
                    from_ms: u64::MAX,
                    until_ms: None,
                    label: "late".into(),
                    band: Band::Clock,
                },
            ];
            data.marks = vec![Mark {
                at_ms: u64::MAX,
                kind: MarkKind::Drained,
                label: String::new(),
            }];
            let svg = render(&data.chart());
            let doc = parse(&svg);
            assert!(!svg.contains("NaN") && !svg.contains("inf"), "{svg}");
            for node in doc.descendants().filter(|n| n.is_element()) {
                for a in [
                    "x", "y", "width", "height", "x1", "x2", "y1", "y2", "cx", "cy",
                ] {
                    if let Some(v) = node.attribute(a) {
                        let v: f64 = v.parse().expect("a number");
                        assert!(v.is_finite() && (0.0..=WIDTH).contains(&v), "{a}={v}");
                    }
                }
            }
        }
        // A single sample, and a single sample at a zero duration.
        for duration in [0, 30_000] {
            let mut data = empty(duration);
            data.samples = vec![Sample {
                at_ms: 0,
                delivered_per_s: 42.0,
                waiting: Some(3),
                unread: None,
            }];
            let svg = render(&data.chart());
            let doc = parse(&svg);
            assert_eq!(by_class(&doc, "delivered")[0].tag_name().name(), "circle");
        }
        // A long title and label are shortened, not spilled off the chart.
        let mut data = empty(10_000);
        data.title = "t".repeat(500);
        data.windows = vec![window(9, None, &"w".repeat(500))];
        let svg = render(&data.chart());
        let doc = parse(&svg);
        let title = doc
            .descendants()
            .find(|n| n.has_tag_name("title"))
            .unwrap()
            .text()
            .unwrap();
        assert!(
            title.ends_with('…') && text_w(title, TITLE_EM) <= WIDTH - 32.0,
            "{title}"
        );
        let label = texts(&doc)
            .into_iter()
            .find(|t| t.starts_with("www"))
            .unwrap();
        assert!(
            label.ends_with('…') && text_w(&label, 11.0) <= PLOT_RIGHT - PLOT_LEFT,
            "{label}"
        );
    }

    #[test]
    fn time_ticks_are_round_and_5_to_12() {
        for span in [
            1_000, 5_000, 10_000, 30_000, 45_000, 60_000, 90_000, 120_000, 300_000, 600_000,
            3_600_000, 86_400_000,
        ] {
            let step = tick_step_ms(span);
            let count = span / step + 1;
            assert!(
                (5..=12).contains(&count),
                "{span} ms: step {step} gives {count} ticks"
            );
        }
        assert_eq!(tick_step_ms(120_000), 15_000);
        assert_eq!(tick_step_ms(60_000), 10_000);
        assert!(tick_step_ms(u64::MAX) > 0);
        let data = example();
        let svg = render(&data.chart());
        let doc = parse(&svg);
        let ticks: Vec<String> = by_class(&doc, "x-ticks")[0]
            .children()
            .filter(|n| n.has_tag_name("text"))
            .filter_map(|n| n.text())
            .map(str::to_string)
            .collect();
        assert_eq!(
            ticks,
            ["0", "15", "30", "45", "60", "75", "90", "105", "120"]
        );
    }

    #[test]
    fn value_axes_hold_the_data_with_headroom() {
        let axis = |max: f64| {
            let scale = nice_axis(max);
            (scale.top, scale.step)
        };
        assert_eq!(axis(100.0), (125.0, 25.0));
        assert_eq!(axis(2000.0), (2500.0, 500.0));
        assert_eq!(axis(0.0), (5.0, 1.0));
        assert_eq!(axis(f64::NAN), (5.0, 1.0));
        assert!(axis(f64::INFINITY).0.is_finite());
        assert_eq!(
            ticks(&nice_axis(100.0)),
            [0.0, 25.0, 50.0, 75.0, 100.0, 125.0]
        );
        assert_eq!(fmt_num(2500.0), "2500");
        assert_eq!(fmt_num(25_000.0), "25k");
        assert_eq!(fmt_num(0.25), "0.25");
    }

    /// The example drill, for a person to look at: set DRILL_SVG_EXAMPLE to a path to get it
    /// written there (e.g. to screenshot it with a headless browser).
    #[test]
    fn example_drill_renders() {
        let data = example();
        let svg = render(&data.chart());
        let doc = parse(&svg);
        assert_eq!(by_class(&doc, "fault").len(), 2);
        assert_eq!(by_class(&doc, "backlog").len(), 1);
        if let Some(path) = std::env::var_os("DRILL_SVG_EXAMPLE") {
            std::fs::write(path, &svg).expect("write the example");
        }
    }
}
