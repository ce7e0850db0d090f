//! `GET /`: a chat page for people at a browser. One HTML file compiled into the binary: it
//! streams answers from this server's `/v1/chat/completions`, shows the thinking apart from
//! the answer, and the speed of each reply. No build step and nothing fetched from elsewhere
//! (its content security policy allows this origin only). The page itself needs no key; the
//! requests it sends carry the one typed into it.
use axum::http::header;
use axum::response::IntoResponse;

/// The page.
const PAGE: &str = include_str!("chat_page.html");

/// `GET /`.
pub(crate) async fn chat_page() -> impl IntoResponse {
    (
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            (header::CACHE_CONTROL, "no-cache"),
            (
                header::CONTENT_SECURITY_POLICY,
                "default-src 'self'; script-src 'self' 'unsafe-inline'; \
                 style-src 'self' 'unsafe-inline'; img-src 'self' data:",
            ),
        ],
        PAGE,
    )
}
