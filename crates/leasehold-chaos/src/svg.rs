//! The timeline picture: hand-written SVG, one row per replica, drawn with leasehold-timeline's
//! primitives.

use leasehold_timeline::draw::{AxisLabels, Svg, TimeScale, esc};

/// A span on one row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Span {
    /// The row.
    pub row: usize,
    /// Start, ms since the Unix epoch.
    pub from_ms: u64,
    /// End, ms since the Unix epoch.
    pub to_ms: u64,
    /// `accepted`, `rejected` or `aborted` for runs; free text otherwise.
    pub class: String,
    /// More text for the tooltip (after `class`), or empty.
    pub detail: String,
}

impl Span {
    fn title(&self) -> String {
        if self.detail.is_empty() {
            self.class.clone()
        } else {
            format!("{}: {}", self.class, self.detail)
        }
    }
}

/// A fault across all rows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Marker {
    /// When it began, ms since the Unix epoch.
    pub at_ms: u64,
    /// When it was repaired, for faults that last.
    pub until_ms: Option<u64>,
    /// The fault kind (colours the marker).
    pub kind: String,
    /// The label.
    pub label: String,
}

/// Everything the picture shows.
#[derive(Debug, Clone, Default)]
pub struct Timeline {
    /// The title line.
    pub title: String,
    /// Start of the time axis, ms since the Unix epoch.
    pub start_ms: u64,
    /// End of the time axis.
    pub end_ms: u64,
    /// Row labels.
    pub rows: Vec<String>,
    /// Replica process lifetimes (thin lines).
    pub lifetimes: Vec<Span>,
    /// Tenures of the leader lease, from the harness's polling.
    pub tenures: Vec<Span>,
    /// Runs of the witness command.
    pub runs: Vec<Span>,
    /// Faults.
    pub faults: Vec<Marker>,
    /// Scheduled times of the firings no replica ran (slots are times: ms since the Unix epoch).
    pub missed: Vec<u64>,
}

const WIDTH: f64 = 1400.0;
const LEFT: f64 = 70.0;
const RIGHT: f64 = 20.0;
const TOP: f64 = 110.0;
const ROW: f64 = 34.0;

fn fault_colour(kind: &str) -> &'static str {
    match kind {
        "kill" => "#d62728",
        "pause" => "#9467bd",
        "terminate" => "#ff7f0e",
        "drop" => "#8c564b",
        "blackhole" => "#333333",
        "delay" => "#bcbd22",
        "store-restart" => "#e377c2",
        _ => "#7f7f7f",
    }
}

fn run_colour(class: &str) -> &'static str {
    match class {
        "accepted" => "#2ca02c",
        "rejected" => "#d62728",
        _ => "#999999",
    }
}

impl Timeline {
    /// The picture as SVG text.
    pub fn render(&self) -> String {
        let plot_w = WIDTH - LEFT - RIGHT;
        let scale = TimeScale::new(self.start_ms, self.end_ms, LEFT, plot_w);
        let x = |ms: u64| scale.x(ms);
        let y = |row: usize| TOP + row as f64 * ROW;
        let rows = self.rows.len().max(1);
        let below = TOP + rows as f64 * ROW;
        let mut s = Svg::new(WIDTH, below + 70.0, 11.0);
        s.text(
            LEFT,
            18.0,
            r#"font-size="14" font-weight="bold""#,
            &self.title,
        );
        s.legend(
            LEFT,
            28.0,
            230.0,
            plot_w,
            &[
                ("#cfe3f7", "", "leader lease held (polled)"),
                ("#2ca02c", "", "run, write accepted"),
                ("#d62728", "", "run, write rejected (stale token)"),
                ("#999999", "", "run stopped before its write"),
                ("#ff7f0e", "", "missed slot (firing with no run)"),
            ],
        );
        for (i, label) in self.rows.iter().enumerate() {
            let fill = if i % 2 == 0 { "#fafafa" } else { "#f0f0f0" };
            s.rect(LEFT, y(i), plot_w, ROW, fill, "", "");
            s.text(8.0, y(i) + ROW / 2.0 + 4.0, "", label);
        }
        // Fault bands (lasting faults) behind everything else.
        for f in &self.faults {
            if let Some(until) = f.until_ms {
                let w = scale.width(f.at_ms, until, 1.0);
                let colour = fault_colour(&f.kind);
                s.rect(
                    x(f.at_ms),
                    TOP,
                    w,
                    below - TOP,
                    colour,
                    r#"fill-opacity="0.12""#,
                    "",
                );
            }
        }
        for l in &self.lifetimes {
            let ly = y(l.row) + ROW - 4.0;
            let (x1, x2) = (x(l.from_ms), x(l.to_ms));
            let name = l.class.split(' ').next().unwrap_or_default();
            s.raw(&format!(
                r##"<g><title>{}</title><line x1="{x1:.1}" y1="{ly}" x2="{x2:.1}" y2="{ly}" stroke="#888" stroke-width="1.5"/><line x1="{x1:.1}" y1="{}" x2="{x1:.1}" y2="{}" stroke="#555" stroke-width="1.5"/><text x="{:.1}" y="{}" font-size="9" fill="#555">{}</text></g>"##,
                esc(&l.title()),
                ly - 5.0,
                ly + 2.0,
                x1 + 2.0,
                ly - 1.0,
                esc(name)
            ));
        }
        for t in &self.tenures {
            let w = scale.width(t.from_ms, t.to_ms, 1.0);
            s.rect(
                x(t.from_ms),
                y(t.row) + 3.0,
                w,
                ROW - 10.0,
                "#cfe3f7",
                "",
                &t.title(),
            );
        }
        for r in &self.runs {
            let w = scale.width(r.from_ms, r.to_ms, 1.5);
            let fill = run_colour(&r.class);
            s.rect(
                x(r.from_ms),
                y(r.row) + 8.0,
                w,
                ROW - 20.0,
                fill,
                "",
                &r.title(),
            );
        }
        // Missed slots: a marker at the foot of the rows at each firing's scheduled time.
        for &at in &self.missed {
            let since = at.saturating_sub(self.start_ms) as f64 / 1000.0;
            s.marker(
                x(at),
                below,
                "#ff7f0e",
                &format!("missed slot {at} (+{since:.3}s)"),
            );
        }
        // Fault markers and labels.
        for f in &self.faults {
            let fx = x(f.at_ms);
            let colour = fault_colour(&f.kind);
            s.raw(&format!(
                r#"<line x1="{fx:.1}" y1="{}" x2="{fx:.1}" y2="{below}" stroke="{colour}" stroke-width="1.2" stroke-dasharray="3,2"/>"#,
                TOP - 4.0,
            ));
            s.raw(&format!(
                r#"<text x="{fx:.1}" y="{}" fill="{colour}" transform="rotate(-40 {fx:.1} {})">{}</text>"#,
                TOP - 6.0,
                TOP - 6.0,
                esc(&f.label)
            ));
        }
        s.axis(
            &scale,
            below + 6.0,
            AxisLabels::SinceStart,
            "time since start",
        );
        s.finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_rows_runs_faults_and_an_axis() {
        let t = Timeline {
            title: "chaos <sqlite>".into(),
            start_ms: 1_000,
            end_ms: 31_000,
            rows: vec!["r0".into(), "r1".into()],
            lifetimes: vec![Span {
                row: 0,
                from_ms: 1_000,
                to_ms: 31_000,
                class: "r0.0".into(),
                detail: String::new(),
            }],
            tenures: vec![Span {
                row: 1,
                from_ms: 2_000,
                to_ms: 9_000,
                class: "r1.0".into(),
                detail: String::new(),
            }],
            runs: vec![
                Span {
                    row: 1,
                    from_ms: 3_000,
                    to_ms: 3_100,
                    class: "accepted".into(),
                    detail: "slot 1700000003000 (+2.000s), token 7".into(),
                },
                Span {
                    row: 0,
                    from_ms: 4_000,
                    to_ms: 7_000,
                    class: "rejected".into(),
                    detail: String::new(),
                },
            ],
            faults: vec![Marker {
                at_ms: 4_000,
                until_ms: Some(6_000),
                kind: "pause".into(),
                label: "pause r0.0".into(),
            }],
            missed: vec![12_000, 12_500],
        };
        let svg = t.render();
        assert!(svg.starts_with("<svg"));
        assert!(svg.trim_end().ends_with("</svg>"));
        assert!(svg.contains("chaos &lt;sqlite&gt;"));
        assert!(svg.contains("pause r0.0"));
        assert!(svg.contains(">0s</text>") && svg.contains(">30s</text>"));
        assert_eq!(svg.matches("#2ca02c").count(), 2); // legend + one accepted run
        assert!(svg.contains("<title>accepted: slot 1700000003000 (+2.000s), token 7</title>"));
        assert!(svg.contains("<title>missed slot 12000 (+11.000s)</title>"));
        assert_eq!(svg.matches("<title>missed slot ").count(), 2);
    }
}
