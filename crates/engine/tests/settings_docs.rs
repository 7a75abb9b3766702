//! The documentation's settings tables name every setting of `ccm_settings` and no
//! other `CRIU_CUDA_MIGRATE_*` variable, so the code, the `settings:` line and the docs cannot drift.

use ccm_settings::ALL;

fn table_names(doc: &str) -> Vec<String> {
    let mut names = Vec::new();
    for line in doc.lines().filter(|l| l.starts_with("| `CRIU_CUDA_MIGRATE_")) {
        let first = line.split('|').nth(1).unwrap_or("");
        for part in first.split('`').filter(|p| p.starts_with("CRIU_CUDA_MIGRATE_")) {
            names.push(part.to_string());
        }
    }
    names
}

fn check(doc_name: &str, doc: &str) {
    let names = table_names(doc);
    for s in ALL {
        assert!(names.iter().any(|n| n == s.env), "{doc_name}'s settings table lacks {}", s.env);
    }
    for n in &names {
        assert!(ALL.iter().any(|s| s.env == n), "{doc_name}'s settings table names {n}, which is no setting");
    }
}

#[test]
fn the_user_guide_and_the_architecture_list_every_setting() {
    check("docs/USER-GUIDE.md", include_str!("../../../docs/USER-GUIDE.md"));
    check("docs/ARCHITECTURE.md", include_str!("../../../docs/ARCHITECTURE.md"));
}

/// The README's plugin-options table: one row per setting, with its option key, its variable and when it applies.
#[test]
fn the_readme_lists_every_setting_as_a_plugin_option() {
    let readme = include_str!("../../../README.md");
    let rows: Vec<Vec<&str>> = readme
        .lines()
        .filter(|l| l.starts_with("| `criu-cuda-migrate."))
        .map(|l| l.split(" | ").map(|c| c.trim_matches(|ch| ch == '|' || ch == ' ')).collect())
        .collect();
    for s in ALL {
        let key = format!("`{}", s.option_name());
        let row =
            rows.iter().find(|r| r[0].strip_prefix(key.as_str()).is_some_and(|rest| rest.starts_with(['=', '[', '`'])));
        let row = row.unwrap_or_else(|| panic!("README's plugin-options table lacks {}", s.option_name()));
        assert_eq!(row.get(1).copied(), Some(format!("`{}`", s.env).as_str()), "README's row of {}", s.option_name());
        assert_eq!(row.get(2).copied(), Some(s.at), "README's row of {}: when it applies", s.option_name());
    }
    assert_eq!(rows.len(), ALL.len(), "README's plugin-options table has rows for no setting: {rows:?}");
}
