//! The dashboard page at `/`: one HTML page, its script and its style, compiled into the binary
//! so the page works on a machine without internet access (no CDN, no web fonts).
//!
//! The page only calls the public HTTP API (`/v1/...`, `/ready`), so it shows what any client
//! would see; charts are drawn as SVG by the script itself. Every request failure is shown
//! where its data would be, with the API's own error message.

use axum::http::header;
use axum::response::{Html, IntoResponse};

const INDEX_HTML: &str = include_str!("index.html");
const APP_JS: &str = include_str!("app.js");
const STYLE_CSS: &str = include_str!("style.css");

/// The assets change only with the binary; `no-cache` makes a browser revalidate after an
/// upgrade instead of running an old script against a new API.
const NO_CACHE: &str = "no-cache";

#[utoipa::path(
    get,
    path = "/",
    tag = "dashboard",
    description = "The dashboard page (HTML). Open.",
    responses((status = 200, description = "The asset"))
)]
pub(crate) async fn page() -> impl IntoResponse {
    ([(header::CACHE_CONTROL, NO_CACHE)], Html(INDEX_HTML))
}

#[utoipa::path(
    get,
    path = "/dashboard.js",
    tag = "dashboard",
    description = "The dashboard script. Open.",
    responses((status = 200, description = "The asset"))
)]
pub(crate) async fn script() -> impl IntoResponse {
    ([(header::CACHE_CONTROL, NO_CACHE), (header::CONTENT_TYPE, "text/javascript; charset=utf-8")], APP_JS)
}

#[utoipa::path(
    get,
    path = "/dashboard.css",
    tag = "dashboard",
    description = "The dashboard style. Open.",
    responses((status = 200, description = "The asset"))
)]
pub(crate) async fn style() -> impl IntoResponse {
    ([(header::CACHE_CONTROL, NO_CACHE), (header::CONTENT_TYPE, "text/css; charset=utf-8")], STYLE_CSS)
}
