//! Drawing primitives of the timeline pictures: an SVG document written as text, a time scale,
//! a time axis, a legend, bars and markers with tooltips.

use std::fmt::Write;
use std::time::{Duration, UNIX_EPOCH};

/// Escapes text for SVG content and attribute values: the characters
/// [`leasehold::text::is_hidden`] names (controls, bidi controls, and all those XML forbids) are
/// written visibly (`\x1b`, `\n`, `\u{202e}`), so text from the store (a failure text, a pause
/// reason) can neither make the document invalid XML nor reorder what a tooltip shows.
pub fn esc(s: &str) -> String {
    leasehold::text::visible(s)
        .replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// Maps times (ms since the Unix epoch) to x positions on a plot `width` wide from `left`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TimeScale {
    start_ms: u64,
    end_ms: u64,
    left: f64,
    width: f64,
}

impl TimeScale {
    /// `start_ms..end_ms` (at least a millisecond) over `left..left + width`.
    pub fn new(start_ms: u64, end_ms: u64, left: f64, width: f64) -> Self {
        Self {
            start_ms,
            end_ms: end_ms.max(start_ms + 1),
            left,
            width,
        }
    }

    /// The x of `ms`, clamped to the plot.
    pub fn x(&self, ms: u64) -> f64 {
        let f = ms.saturating_sub(self.start_ms) as f64 / self.span_ms() as f64;
        self.left + (f * self.width).min(self.width)
    }

    /// The width from `from_ms` to `to_ms`, at least `min`.
    pub fn width(&self, from_ms: u64, to_ms: u64, min: f64) -> f64 {
        (self.x(to_ms) - self.x(from_ms)).max(min)
    }

    /// The first time on the axis.
    pub fn start_ms(&self) -> u64 {
        self.start_ms
    }

    /// How long the axis is.
    pub fn span_ms(&self) -> u64 {
        self.end_ms - self.start_ms
    }

    /// The plot's left edge.
    pub fn left(&self) -> f64 {
        self.left
    }

    /// The plot's width.
    pub fn plot_width(&self) -> f64 {
        self.width
    }
}

/// How the axis labels its ticks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AxisLabels {
    /// Seconds since the start (`0s`, `5s`, …), ticks from the start.
    SinceStart,
    /// UTC wall time (`03:15`, a date at midnight), ticks on round times.
    Utc,
}

/// Tick intervals an axis picks from: the first that gives at most `MAX_TICKS` ticks.
const STEPS_MS: &[u64] = &[
    1_000,
    2_000,
    5_000,
    10_000,
    15_000,
    30_000,
    60_000,
    120_000,
    300_000,
    600_000,
    900_000,
    1_800_000,
    3_600_000,
    7_200_000,
    10_800_000,
    21_600_000,
    43_200_000,
    86_400_000,
    172_800_000,
    604_800_000,
    2_592_000_000,
];
const MAX_TICKS: u64 = 15;
const DAY_MS: u64 = 86_400_000;

fn tick_step(span_ms: u64) -> u64 {
    STEPS_MS
        .iter()
        .copied()
        .find(|s| span_ms / s <= MAX_TICKS)
        .unwrap_or(span_ms.div_ceil(MAX_TICKS).max(1))
}

/// `2026-12-03T03:15:00Z` cut to what a tick needs.
fn utc(ms: u64) -> String {
    humantime::format_rfc3339_seconds(UNIX_EPOCH + Duration::from_millis(ms)).to_string()
}

/// A tick's label in UTC: dates at midnight and for steps of a day or more, else the time.
fn utc_tick(ms: u64, step: u64) -> String {
    let text = utc(ms);
    if step >= DAY_MS || ms.is_multiple_of(DAY_MS) {
        text[5..10].to_owned()
    } else if step < 60_000 {
        text[11..19].to_owned()
    } else {
        text[11..16].to_owned()
    }
}

/// `2026-12-03 03:15` (UTC), for captions.
pub fn utc_minute(ms: u64) -> String {
    let text = utc(ms);
    format!("{} {}", &text[..10], &text[11..16])
}

/// A legend entry: the swatch's fill, more attributes for it (a stroke) or empty, and what it
/// means.
pub type Swatch<'a> = (&'a str, &'a str, &'a str);

/// The height of a row of the legend.
pub const LEGEND_ROW: f64 = 16.0;

fn per_row(column: f64, width: f64) -> usize {
    ((width / column) as usize).max(1)
}

/// How many rows [`Svg::legend`] takes for `items` entries `column` apart within `width`.
pub fn legend_rows(items: usize, column: f64, width: f64) -> usize {
    items.div_ceil(per_row(column, width))
}

/// An SVG document, drawn element by element.
#[derive(Debug)]
pub struct Svg {
    out: String,
}

impl Svg {
    /// A `width` × `height` document on white, in sans-serif at `font_size`.
    pub fn new(width: f64, height: f64, font_size: f64) -> Self {
        let mut out = String::new();
        let _ = writeln!(
            out,
            r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="{font_size}">"#
        );
        let _ = writeln!(out, r#"<rect width="100%" height="100%" fill="white"/>"#);
        Self { out }
    }

    /// Text at (`x`, `y`); `attrs` are more attributes (`font-weight="bold"`), or empty.
    pub fn text(&mut self, x: f64, y: f64, attrs: &str, text: &str) {
        let _ = writeln!(
            self.out,
            r#"<text x="{x:.1}" y="{y:.1}" {attrs}>{}</text>"#,
            esc(text)
        );
    }

    /// Colour swatches and their meaning, `column` apart from (`x`, `y`), in as many rows of
    /// [`LEGEND_ROW`] as `width` needs (see [`legend_rows`]).
    pub fn legend(&mut self, x: f64, y: f64, column: f64, width: f64, items: &[Swatch<'_>]) {
        let per_row = per_row(column, width);
        for (i, (fill, attrs, text)) in items.iter().enumerate() {
            let lx = x + (i % per_row) as f64 * column;
            let ly = y + (i / per_row) as f64 * LEGEND_ROW;
            let _ = writeln!(
                self.out,
                r#"<rect x="{lx:.1}" y="{ly:.1}" width="14" height="10" fill="{fill}" {attrs}/><text x="{:.1}" y="{:.1}">{}</text>"#,
                lx + 18.0,
                ly + 9.0,
                esc(text)
            );
        }
    }

    /// A filled rectangle, with `title` as its tooltip if not empty; `attrs` as in
    /// [`text`](Self::text).
    #[allow(clippy::too_many_arguments)]
    pub fn rect(&mut self, x: f64, y: f64, w: f64, h: f64, fill: &str, attrs: &str, title: &str) {
        let _ = write!(
            self.out,
            r#"<rect x="{x:.1}" y="{y:.1}" width="{w:.1}" height="{h:.1}" fill="{fill}" {attrs}"#
        );
        self.close_with_title("rect", title);
    }

    /// A small triangle pointing down at `x` with its tip at `y`, with `title` as its tooltip.
    pub fn marker(&mut self, x: f64, y: f64, fill: &str, title: &str) {
        let _ = write!(
            self.out,
            r#"<path d="M{x:.1} {y:.1} l-4 -7 h8 z" fill="{fill}""#
        );
        self.close_with_title("path", title);
    }

    fn close_with_title(&mut self, element: &str, title: &str) {
        if title.is_empty() {
            self.out.push_str("/>\n");
        } else {
            let _ = writeln!(self.out, "><title>{}</title></{element}>", esc(title));
        }
    }

    /// A time axis at `y` under the plot of `scale`, with ticks, their labels and `caption`
    /// centred under them.
    pub fn axis(&mut self, scale: &TimeScale, y: f64, labels: AxisLabels, caption: &str) {
        let right = scale.left() + scale.plot_width();
        let _ = writeln!(
            self.out,
            r#"<line x1="{:.1}" y1="{y:.1}" x2="{right:.1}" y2="{y:.1}" stroke="black"/>"#,
            scale.left()
        );
        let step = tick_step(scale.span_ms());
        let start = scale.start_ms();
        let first = match labels {
            AxisLabels::SinceStart => start,
            AxisLabels::Utc => start.div_ceil(step) * step,
        };
        let mut t = first;
        while t <= start + scale.span_ms() {
            let tx = scale.x(t);
            let label = match labels {
                AxisLabels::SinceStart => format!("{}s", (t - start) / 1000),
                AxisLabels::Utc => utc_tick(t, step),
            };
            let _ = writeln!(
                self.out,
                r#"<line x1="{tx:.1}" y1="{y:.1}" x2="{tx:.1}" y2="{:.1}" stroke="black"/><text x="{tx:.1}" y="{:.1}" text-anchor="middle">{label}</text>"#,
                y + 5.0,
                y + 18.0
            );
            t += step;
        }
        self.text(
            scale.left() + scale.plot_width() / 2.0,
            y + 36.0,
            r#"text-anchor="middle""#,
            caption,
        );
    }

    /// Any other element, written as given (escape its text with [`esc`]).
    pub fn raw(&mut self, element: &str) {
        self.out.push_str(element);
        self.out.push('\n');
    }

    /// The document's text.
    pub fn finish(mut self) -> String {
        self.out.push_str("</svg>\n");
        self.out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_scale_clamps_and_keeps_a_minimum_width() {
        let s = TimeScale::new(1_000, 2_000, 10.0, 100.0);
        assert_eq!(s.x(500), 10.0);
        assert_eq!(s.x(1_500), 60.0);
        assert_eq!(s.x(9_000), 110.0);
        assert_eq!(s.width(1_500, 1_500, 2.0), 2.0);
        // An empty range does not divide by zero.
        assert_eq!(TimeScale::new(5, 5, 0.0, 10.0).x(5), 0.0);
    }

    #[test]
    fn utc_ticks_fall_on_round_times_and_name_the_day_at_midnight() {
        let day = 1_796_342_400_000; // 2026-12-04T00:00:00Z
        let scale = TimeScale::new(
            day - 3 * 3_600_000 - 60_000,
            day + 3 * 3_600_000,
            0.0,
            600.0,
        );
        let mut svg = Svg::new(600.0, 100.0, 11.0);
        svg.axis(&scale, 50.0, AxisLabels::Utc, "UTC");
        let text = svg.finish();
        assert!(text.contains(">21:00</text>"), "{text}");
        assert!(text.contains(">12-04</text>"), "{text}");
        assert!(text.contains(">03:00</text>"), "{text}");
        assert!(!text.contains(">20:59"), "{text}");
    }

    #[test]
    fn a_legend_wraps_within_its_width() {
        assert_eq!(legend_rows(7, 100.0, 350.0), 3);
        assert_eq!(legend_rows(0, 100.0, 350.0), 0);
        let mut svg = Svg::new(400.0, 100.0, 11.0);
        let items: Vec<Swatch> = ["a", "b", "c", "d"].map(|t| ("red", "", t)).to_vec();
        svg.legend(10.0, 20.0, 100.0, 350.0, &items);
        let text = svg.finish();
        assert!(text.contains(r#"<rect x="210.0" y="20.0""#), "{text}");
        assert!(text.contains(r#"<rect x="10.0" y="36.0""#), "{text}");
    }

    #[test]
    fn text_is_escaped() {
        let mut svg = Svg::new(10.0, 10.0, 11.0);
        svg.text(0.0, 0.0, "", "a <b> & \"c\"");
        svg.rect(0.0, 0.0, 1.0, 1.0, "red", "", "x<y");
        let text = svg.finish();
        assert!(text.contains("a &lt;b&gt; &amp; &quot;c&quot;"));
        assert!(text.contains("<title>x&lt;y</title></rect>"));
    }
}
