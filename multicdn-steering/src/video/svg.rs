//! A small hand-written SVG line chart: one line per series, dashed reference lines, labelled
//! vertical markers, stacked panels. No dependency; the output is plain SVG 1.1.

use std::fmt::Write as _;

use super::sim::{Happening, Timeline};

const PALETTE: [&str; 8] = [
    "#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf",
];

/// One line.
#[derive(Debug, Clone, PartialEq)]
pub struct Series {
    /// Legend text.
    pub name: String,
    /// Points, x ascending.
    pub points: Vec<(f64, f64)>,
}

/// A horizontal reference line (a capacity), drawn dashed in its series' colour.
#[derive(Debug, Clone, PartialEq)]
pub struct Reference {
    /// The y value.
    pub y: f64,
    /// The colour index (the series it belongs to).
    pub series: usize,
}

/// One panel.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Chart {
    /// The title.
    pub title: String,
    /// The x axis label.
    pub x_label: String,
    /// The y axis label.
    pub y_label: String,
    /// The lines.
    pub series: Vec<Series>,
    /// Dashed horizontal lines.
    pub references: Vec<Reference>,
    /// Labelled vertical lines (x, label).
    pub markers: Vec<(f64, String)>,
}

/// Escapes text for SVG content and attributes.
pub fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c if c.is_control() => {}
            c => out.push(c),
        }
    }
    out
}

/// A "nice" step for about `target` ticks over `range`: 1, 2 or 5 times a power of ten.
fn nice_step(range: f64, target: f64) -> f64 {
    if !(range.is_finite() && range > 0.0) {
        return 1.0;
    }
    let raw = range / target;
    let mag = 10f64.powf(raw.log10().floor());
    let norm = raw / mag;
    let nice = if norm <= 1.0 {
        1.0
    } else if norm <= 2.0 {
        2.0
    } else if norm <= 5.0 {
        5.0
    } else {
        10.0
    };
    nice * mag
}

fn fmt_num(v: f64) -> String {
    if (v - v.round()).abs() < 1e-9 {
        format!("{}", v.round() as i64)
    } else {
        format!("{v:.1}")
    }
}

/// Renders panels stacked vertically into one SVG document.
pub fn render(charts: &[Chart], width: u32, panel_height: u32) -> String {
    let (w, ph) = (f64::from(width.max(200)), f64::from(panel_height.max(150)));
    let total_h = ph * charts.len().max(1) as f64;
    let mut out = String::new();
    let _ = writeln!(
        out,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{total_h}" viewBox="0 0 {w} {total_h}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(out, r#"<rect width="100%" height="100%" fill="white"/>"#);
    for (i, c) in charts.iter().enumerate() {
        panel(&mut out, c, 0.0, ph * i as f64, w, ph);
    }
    out.push_str("</svg>\n");
    out
}

fn panel(out: &mut String, c: &Chart, x0: f64, y0: f64, w: f64, h: f64) {
    let (left, right, top, bottom) = (70.0, 170.0, 36.0, 44.0);
    let (pw, ph) = (w - left - right, h - top - bottom);
    let xs = c.series.iter().flat_map(|s| s.points.iter().map(|p| p.0));
    let x_max = xs.fold(0.0, f64::max).max(1e-9);
    let ys = c
        .series
        .iter()
        .flat_map(|s| s.points.iter().map(|p| p.1))
        .chain(c.references.iter().map(|r| r.y));
    let y_top = ys.filter(|y| y.is_finite()).fold(0.0, f64::max);
    let y_step = nice_step(y_top.max(1.0), 5.0);
    // A little headroom so a peak never sits on the frame.
    let y_max = (y_top * 1.05 / y_step).ceil().max(1.0) * y_step;
    let px = |x: f64| x0 + left + x / x_max * pw;
    let py = |y: f64| y0 + top + ph - (y.clamp(0.0, y_max) / y_max) * ph;
    let _ = writeln!(
        out,
        r#"<text x="{}" y="{}" font-size="15" font-weight="bold">{}</text>"#,
        x0 + left,
        y0 + 22.0,
        escape(&c.title)
    );
    // Grid and y ticks.
    let mut y = 0.0;
    while y <= y_max + 1e-9 {
        let _ = writeln!(
            out,
            r##"<line x1="{:.1}" y1="{:.1}" x2="{:.1}" y2="{:.1}" stroke="#e5e5e5"/><text x="{:.1}" y="{:.1}" text-anchor="end">{}</text>"##,
            px(0.0),
            py(y),
            px(x_max),
            py(y),
            px(0.0) - 6.0,
            py(y) + 4.0,
            fmt_num(y)
        );
        y += y_step;
    }
    let x_step = nice_step(x_max, 10.0);
    let mut x = 0.0;
    while x <= x_max + 1e-9 {
        let _ = writeln!(
            out,
            r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">{}</text>"#,
            px(x),
            py(0.0) + 16.0,
            fmt_num(x)
        );
        x += x_step;
    }
    let _ = writeln!(
        out,
        r##"<line x1="{:.1}" y1="{:.1}" x2="{:.1}" y2="{:.1}" stroke="#333"/><line x1="{:.1}" y1="{:.1}" x2="{:.1}" y2="{:.1}" stroke="#333"/>"##,
        px(0.0),
        py(0.0),
        px(x_max),
        py(0.0),
        px(0.0),
        py(0.0),
        px(0.0),
        py(y_max)
    );
    let _ = writeln!(
        out,
        r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">{}</text>"#,
        px(x_max / 2.0),
        py(0.0) + 34.0,
        escape(&c.x_label)
    );
    let _ = writeln!(
        out,
        r#"<text transform="translate({:.1},{:.1}) rotate(-90)" text-anchor="middle">{}</text>"#,
        x0 + 18.0,
        y0 + top + ph / 2.0,
        escape(&c.y_label)
    );
    for (x, label) in &c.markers {
        let _ = writeln!(
            out,
            r##"<line x1="{:.1}" y1="{:.1}" x2="{:.1}" y2="{:.1}" stroke="#999" stroke-dasharray="2,3"/><text x="{:.1}" y="{:.1}" font-size="10" fill="#555" transform="rotate(-90 {:.1} {:.1})" text-anchor="end">{}</text>"##,
            px(*x),
            py(0.0),
            px(*x),
            py(y_max),
            px(*x) - 3.0,
            py(y_max) + 4.0,
            px(*x) - 3.0,
            py(y_max) + 4.0,
            escape(label)
        );
    }
    for r in &c.references {
        let colour = PALETTE[r.series % PALETTE.len()];
        let _ = writeln!(
            out,
            r#"<line x1="{:.1}" y1="{:.1}" x2="{:.1}" y2="{:.1}" stroke="{colour}" stroke-opacity="0.6" stroke-dasharray="6,4"/>"#,
            px(0.0),
            py(r.y),
            px(x_max),
            py(r.y)
        );
    }
    for (i, s) in c.series.iter().enumerate() {
        let colour = PALETTE[i % PALETTE.len()];
        let pts: Vec<String> = s
            .points
            .iter()
            .filter(|p| p.0.is_finite() && p.1.is_finite())
            .map(|&(x, y)| format!("{:.1},{:.1}", px(x), py(y)))
            .collect();
        let _ = writeln!(
            out,
            r#"<polyline fill="none" stroke="{colour}" stroke-width="2" points="{}"/>"#,
            pts.join(" ")
        );
        let ly = y0 + top + 8.0 + 18.0 * i as f64;
        let lx = px(x_max) + 16.0;
        let _ = writeln!(
            out,
            r#"<line x1="{lx:.1}" y1="{ly:.1}" x2="{:.1}" y2="{ly:.1}" stroke="{colour}" stroke-width="3"/><text x="{:.1}" y="{:.1}">{}</text>"#,
            lx + 18.0,
            lx + 24.0,
            ly + 4.0,
            escape(&s.name)
        );
    }
}

/// A chart of every node's load (Gbps) over time (minutes), capacities dashed, and the
/// failures, recoveries and collapses marked.
pub fn timeline_chart(title: &str, timeline: &Timeline) -> Chart {
    let minutes = |d: std::time::Duration| d.as_secs_f64() / 60.0;
    let series = timeline
        .node_ids
        .iter()
        .enumerate()
        .map(|(n, id)| Series {
            name: id.clone(),
            points: timeline
                .steps
                .iter()
                .map(|s| (minutes(s.at), s.nodes.get(n).map_or(0.0, |x| x.load_gbps)))
                .collect(),
        })
        .collect();
    let references = timeline
        .capacities
        .iter()
        .enumerate()
        .map(|(series, &y)| Reference { y, series })
        .collect();
    let markers = timeline
        .events
        .iter()
        .filter_map(|e| {
            let label = match &e.what {
                Happening::NodeDown { node } => format!("{node} down"),
                Happening::NodeUp { node } => format!("{node} up"),
                Happening::Collapsed { node, .. } => format!("{node} collapses"),
                _ => return None,
            };
            Some((minutes(e.at), label))
        })
        .collect();
    Chart {
        title: title.to_owned(),
        x_label: "minutes".into(),
        y_label: "load, Gbps (capacity dashed)".into(),
        series,
        references,
        markers,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_one_polyline_per_series_and_escapes_text() {
        let c = Chart {
            title: "a <b> & c".into(),
            series: vec![
                Series {
                    name: "x".into(),
                    points: vec![(0.0, 1.0), (1.0, 2.0)],
                },
                Series {
                    name: "y".into(),
                    points: vec![(0.0, 3.0), (1.0, f64::NAN)],
                },
            ],
            references: vec![Reference { y: 2.5, series: 0 }],
            markers: vec![(0.5, "m".into())],
            ..Chart::default()
        };
        let svg = render(&[c.clone(), c], 800, 300);
        assert!(svg.starts_with("<svg"));
        assert!(svg.trim_end().ends_with("</svg>"));
        assert_eq!(svg.matches("<polyline").count(), 4);
        assert!(svg.contains("a &lt;b&gt; &amp; c"));
        assert!(!svg.contains("NaN"));
    }

    #[test]
    fn nice_steps_are_one_two_or_five_times_a_power_of_ten() {
        assert_eq!(nice_step(655.0, 5.0), 200.0);
        assert_eq!(nice_step(20.0, 10.0), 2.0);
        assert_eq!(nice_step(0.0, 5.0), 1.0);
    }
}
