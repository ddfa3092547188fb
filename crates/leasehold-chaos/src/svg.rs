//! The timeline picture: hand-written SVG, one row per replica.

use std::fmt::Write;

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
            esc(&self.class)
        } else {
            esc(&format!("{}: {}", self.class, self.detail))
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

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

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

fn tick_step(span_s: f64) -> f64 {
    [1.0, 2.0, 5.0, 10.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0]
        .into_iter()
        .find(|s| span_s / s <= 15.0)
        .unwrap_or(1200.0)
}

impl Timeline {
    /// The picture as SVG text.
    pub fn render(&self) -> String {
        let span_ms = self.end_ms.saturating_sub(self.start_ms).max(1) as f64;
        let plot_w = WIDTH - LEFT - RIGHT;
        let x = |ms: u64| {
            LEFT + (ms.saturating_sub(self.start_ms) as f64 / span_ms * plot_w).min(plot_w)
        };
        let y = |row: usize| TOP + row as f64 * ROW;
        let rows = self.rows.len().max(1);
        let height = TOP + rows as f64 * ROW + 70.0;
        let mut s = String::new();
        let _ = writeln!(
            s,
            r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" viewBox="0 0 {WIDTH} {height}" font-family="sans-serif" font-size="11">"#
        );
        let _ = writeln!(s, r#"<rect width="100%" height="100%" fill="white"/>"#);
        let _ = writeln!(
            s,
            r#"<text x="{LEFT}" y="18" font-size="14" font-weight="bold">{}</text>"#,
            esc(&self.title)
        );
        // Legend.
        let legend = [
            ("#cfe3f7", "leader lease held (polled)"),
            ("#2ca02c", "run, write accepted"),
            ("#d62728", "run, write rejected (stale token)"),
            ("#999999", "run stopped before its write"),
            ("#ff7f0e", "missed slot (firing with no run)"),
        ];
        for (i, (colour, text)) in legend.iter().enumerate() {
            let lx = LEFT + i as f64 * 230.0;
            let _ = writeln!(
                s,
                r#"<rect x="{lx}" y="28" width="14" height="10" fill="{colour}"/><text x="{}" y="37">{text}</text>"#,
                lx + 18.0
            );
        }
        // Rows.
        for (i, label) in self.rows.iter().enumerate() {
            let _ = writeln!(
                s,
                r#"<rect x="{LEFT}" y="{}" width="{plot_w}" height="{ROW}" fill="{}"/><text x="8" y="{}">{}</text>"#,
                y(i),
                if i % 2 == 0 { "#fafafa" } else { "#f0f0f0" },
                y(i) + ROW / 2.0 + 4.0,
                esc(label)
            );
        }
        // Fault bands (lasting faults) behind everything else.
        for f in &self.faults {
            if let Some(until) = f.until_ms {
                let _ = writeln!(
                    s,
                    r#"<rect x="{:.1}" y="{TOP}" width="{:.1}" height="{}" fill="{}" fill-opacity="0.12"/>"#,
                    x(f.at_ms),
                    (x(until) - x(f.at_ms)).max(1.0),
                    rows as f64 * ROW,
                    fault_colour(&f.kind)
                );
            }
        }
        for l in &self.lifetimes {
            let ly = y(l.row) + ROW - 4.0;
            let (x1, x2) = (x(l.from_ms), x(l.to_ms));
            let name = l.class.split(' ').next().unwrap_or_default();
            let _ = writeln!(
                s,
                r##"<g><title>{}</title><line x1="{x1:.1}" y1="{ly}" x2="{x2:.1}" y2="{ly}" stroke="#888" stroke-width="1.5"/><line x1="{x1:.1}" y1="{}" x2="{x1:.1}" y2="{}" stroke="#555" stroke-width="1.5"/><text x="{:.1}" y="{}" font-size="9" fill="#555">{}</text></g>"##,
                l.title(),
                ly - 5.0,
                ly + 2.0,
                x1 + 2.0,
                ly - 1.0,
                esc(name)
            );
        }
        for t in &self.tenures {
            let _ = writeln!(
                s,
                r##"<rect x="{:.1}" y="{}" width="{:.1}" height="{}" fill="#cfe3f7"><title>{}</title></rect>"##,
                x(t.from_ms),
                y(t.row) + 3.0,
                (x(t.to_ms) - x(t.from_ms)).max(1.0),
                ROW - 10.0,
                t.title()
            );
        }
        for r in &self.runs {
            let _ = writeln!(
                s,
                r#"<rect x="{:.1}" y="{}" width="{:.1}" height="{}" fill="{}"><title>{}</title></rect>"#,
                x(r.from_ms),
                y(r.row) + 8.0,
                (x(r.to_ms) - x(r.from_ms)).max(1.5),
                ROW - 20.0,
                run_colour(&r.class),
                r.title()
            );
        }
        // Missed slots: a tick under the rows at each firing's scheduled time.
        let below = TOP + rows as f64 * ROW;
        for &at in &self.missed {
            let mx = x(at);
            let _ = writeln!(
                s,
                r##"<path d="M{mx:.1} {} l-3 5 h6 z" fill="#ff7f0e"><title>missed slot {at} (+{:.3}s)</title></path>"##,
                below - 5.0,
                at.saturating_sub(self.start_ms) as f64 / 1000.0
            );
        }
        // Fault markers and labels.
        for f in &self.faults {
            let fx = x(f.at_ms);
            let colour = fault_colour(&f.kind);
            let _ = writeln!(
                s,
                r#"<line x1="{fx:.1}" y1="{}" x2="{fx:.1}" y2="{}" stroke="{colour}" stroke-width="1.2" stroke-dasharray="3,2"/>"#,
                TOP - 4.0,
                TOP + rows as f64 * ROW
            );
            let _ = writeln!(
                s,
                r#"<text x="{fx:.1}" y="{}" fill="{colour}" transform="rotate(-40 {fx:.1} {})">{}</text>"#,
                TOP - 6.0,
                TOP - 6.0,
                esc(&f.label)
            );
        }
        // Time axis.
        let axis_y = TOP + rows as f64 * ROW + 6.0;
        let _ = writeln!(
            s,
            r#"<line x1="{LEFT}" y1="{axis_y}" x2="{}" y2="{axis_y}" stroke="black"/>"#,
            LEFT + plot_w
        );
        let step = tick_step(span_ms / 1000.0);
        let mut t = 0.0;
        while t * 1000.0 <= span_ms {
            let tx = LEFT + t * 1000.0 / span_ms * plot_w;
            let _ = writeln!(
                s,
                r#"<line x1="{tx:.1}" y1="{axis_y}" x2="{tx:.1}" y2="{}" stroke="black"/><text x="{tx:.1}" y="{}" text-anchor="middle">{t}s</text>"#,
                axis_y + 5.0,
                axis_y + 18.0
            );
            t += step;
        }
        let _ = writeln!(
            s,
            r#"<text x="{}" y="{}" text-anchor="middle">time since start</text>"#,
            LEFT + plot_w / 2.0,
            axis_y + 36.0
        );
        s.push_str("</svg>\n");
        s
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
