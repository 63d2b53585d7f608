//! Drawing one screen of `ferrite top`: the tab bar, the current tab's table, a status line.

use super::table::{TextTable, TABS};
use ratatui::layout::{Constraint, Layout};
use ratatui::style::{Modifier, Style};
use ratatui::widgets::{Block, Paragraph, Row, Table, Tabs};
use ratatui::Frame;

/// What one screen shows.
pub struct Screen<'a> {
    /// The selected tab.
    pub tab: usize,
    /// Its table.
    pub table: &'a TextTable,
    /// The column it is sorted by.
    pub sort_col: usize,
    /// The status line (the socket, or the last error).
    pub status: &'a str,
}

/// Draws `s` on the whole frame.
pub fn draw(f: &mut Frame, s: &Screen) {
    let [bar, body, status] =
        Layout::vertical([Constraint::Length(3), Constraint::Min(3), Constraint::Length(1)]).areas(f.area());
    let titles: Vec<String> = TABS.iter().enumerate().map(|(i, t)| format!("{} {t}", i + 1)).collect();
    let tabs = Tabs::new(titles)
        .select(s.tab)
        .highlight_style(Style::default().add_modifier(Modifier::REVERSED))
        .block(Block::bordered().title(" ferrite top "));
    f.render_widget(tabs, bar);
    let header =
        Row::new(s.table.header.iter().enumerate().map(
            |(i, h)| {
                if i == s.sort_col {
                    format!("{h} *")
                } else {
                    h.to_string()
                }
            },
        ))
        .style(Style::default().add_modifier(Modifier::BOLD));
    let widths = vec![Constraint::Fill(1); s.table.header.len()];
    let rows = s.table.rows.iter().map(|r| Row::new(r.iter().cloned()));
    let table = Table::new(rows, widths).header(header).block(Block::bordered());
    f.render_widget(table, body);
    f.render_widget(
        Paragraph::new(format!("Tab/1-3: tabs  s: sort  h: p99 (histograms)  q: quit  | {}", s.status)),
        status,
    );
}
