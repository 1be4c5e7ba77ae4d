use proptest::prelude::*;

use super::*;

fn url(s: &str) -> Url {
    Url::parse(s).unwrap()
}

fn pathway(id: &str, base: &str) -> Pathway {
    Pathway {
        id: id.into(),
        base: url(base),
    }
}

/// Two CDNs, the second under a path prefix.
fn two() -> TagOptions {
    TagOptions {
        server_uri: "https://steer.example.com/v1/hls.json?content=vod".into(),
        default_pathway: "cdn-a".into(),
        pathways: vec![
            pathway("cdn-a", "https://a.example.net/"),
            pathway("cdn-b", "https://b.example.net/edge/"),
        ],
    }
}

fn three() -> TagOptions {
    let mut o = two();
    o.pathways
        .push(pathway("cdn-c", "https://c.example.net:8443/"));
    o.default_pathway = "cdn-b".into();
    o
}

fn master_url() -> Url {
    url("https://origin.example.com/vod/master.m3u8")
}

/// What `ffmpeg -f hls -master_pl_name master.m3u8 -var_stream_map ...` writes, with an
/// I-frame playlist, an absolute URI and a signed query added.
const FFMPEG: &str = "#EXTM3U
#EXT-X-VERSION:6
#EXT-X-INDEPENDENT-SEGMENTS
#EXT-X-MEDIA:TYPE=AUDIO,GROUP-ID=\"group_aud\",NAME=\"audio_0\",DEFAULT=YES,CHANNELS=\"2\",URI=\"audio/stream.m3u8\"
#EXT-X-STREAM-INF:BANDWIDTH=5605600,AVERAGE-BANDWIDTH=5000000,RESOLUTION=1920x1080,FRAME-RATE=25.000,CODECS=\"avc1.640028,mp4a.40.2\",AUDIO=\"group_aud\"
1080p/stream.m3u8?token=abc&exp=1
#EXT-X-STREAM-INF:BANDWIDTH=2855600,RESOLUTION=1280x720,CODECS=\"avc1.4d401f,mp4a.40.2\",AUDIO=\"group_aud\"
720p/stream.m3u8
#EXT-X-STREAM-INF:BANDWIDTH=1275600,RESOLUTION=640x360,CODECS=\"avc1.42c01e,mp4a.40.2\",AUDIO=\"group_aud\"
https://origin.example.com/vod/360p/stream.m3u8
#EXT-X-I-FRAME-STREAM-INF:BANDWIDTH=186000,RESOLUTION=1920x1080,CODECS=\"avc1.640028\",URI=\"1080p/iframes.m3u8\"
";

const FFMPEG_TAGGED: &str = "#EXTM3U
#EXT-X-VERSION:6
#EXT-X-CONTENT-STEERING:SERVER-URI=\"https://steer.example.com/v1/hls.json?content=vod\",PATHWAY-ID=\"cdn-a\"
#EXT-X-INDEPENDENT-SEGMENTS
#EXT-X-MEDIA:TYPE=AUDIO,GROUP-ID=\"group_aud-cdn-a\",NAME=\"audio_0\",DEFAULT=YES,CHANNELS=\"2\",URI=\"https://a.example.net/vod/audio/stream.m3u8\"
#EXT-X-MEDIA:TYPE=AUDIO,GROUP-ID=\"group_aud-cdn-b\",NAME=\"audio_0\",DEFAULT=YES,CHANNELS=\"2\",URI=\"https://b.example.net/edge/vod/audio/stream.m3u8\"
#EXT-X-STREAM-INF:BANDWIDTH=5605600,AVERAGE-BANDWIDTH=5000000,RESOLUTION=1920x1080,FRAME-RATE=25.000,CODECS=\"avc1.640028,mp4a.40.2\",AUDIO=\"group_aud-cdn-a\",PATHWAY-ID=\"cdn-a\"
https://a.example.net/vod/1080p/stream.m3u8?token=abc&exp=1
#EXT-X-STREAM-INF:BANDWIDTH=5605600,AVERAGE-BANDWIDTH=5000000,RESOLUTION=1920x1080,FRAME-RATE=25.000,CODECS=\"avc1.640028,mp4a.40.2\",AUDIO=\"group_aud-cdn-b\",PATHWAY-ID=\"cdn-b\"
https://b.example.net/edge/vod/1080p/stream.m3u8?token=abc&exp=1
#EXT-X-STREAM-INF:BANDWIDTH=2855600,RESOLUTION=1280x720,CODECS=\"avc1.4d401f,mp4a.40.2\",AUDIO=\"group_aud-cdn-a\",PATHWAY-ID=\"cdn-a\"
https://a.example.net/vod/720p/stream.m3u8
#EXT-X-STREAM-INF:BANDWIDTH=2855600,RESOLUTION=1280x720,CODECS=\"avc1.4d401f,mp4a.40.2\",AUDIO=\"group_aud-cdn-b\",PATHWAY-ID=\"cdn-b\"
https://b.example.net/edge/vod/720p/stream.m3u8
#EXT-X-STREAM-INF:BANDWIDTH=1275600,RESOLUTION=640x360,CODECS=\"avc1.42c01e,mp4a.40.2\",AUDIO=\"group_aud-cdn-a\",PATHWAY-ID=\"cdn-a\"
https://a.example.net/vod/360p/stream.m3u8
#EXT-X-STREAM-INF:BANDWIDTH=1275600,RESOLUTION=640x360,CODECS=\"avc1.42c01e,mp4a.40.2\",AUDIO=\"group_aud-cdn-b\",PATHWAY-ID=\"cdn-b\"
https://b.example.net/edge/vod/360p/stream.m3u8
#EXT-X-I-FRAME-STREAM-INF:BANDWIDTH=186000,RESOLUTION=1920x1080,CODECS=\"avc1.640028\",URI=\"https://a.example.net/vod/1080p/iframes.m3u8\",PATHWAY-ID=\"cdn-a\"
#EXT-X-I-FRAME-STREAM-INF:BANDWIDTH=186000,RESOLUTION=1920x1080,CODECS=\"avc1.640028\",URI=\"https://b.example.net/edge/vod/1080p/iframes.m3u8\",PATHWAY-ID=\"cdn-b\"
";

/// Subtitles, closed captions (one variant with `NONE`), a video group and comments.
const RENDITIONS: &str = "#EXTM3U
#EXT-X-MEDIA:TYPE=AUDIO,GROUP-ID=\"aac\",LANGUAGE=\"en\",NAME=\"English, stereo\",DEFAULT=YES,URI=\"https://origin.example.com/vod/en/aac.m3u8\"
#EXT-X-MEDIA:TYPE=AUDIO,GROUP-ID=\"aac\",LANGUAGE=\"fr\",NAME=\"Français\",URI=\"fr/aac.m3u8\"
#EXT-X-MEDIA:TYPE=SUBTITLES,GROUP-ID=\"subs\",NAME=\"English\",LANGUAGE=\"en\",URI=\"subs/en.m3u8\"
#EXT-X-MEDIA:TYPE=CLOSED-CAPTIONS,GROUP-ID=\"cc\",NAME=\"CC1\",INSTREAM-ID=\"CC1\"
# a comment stays where it is
#EXT-X-SESSION-DATA:DATA-ID=\"com.example.title\",VALUE=\"Demo\"
#EXT-X-STREAM-INF:BANDWIDTH=800000,CODECS=\"avc1.4d401e,mp4a.40.2\",AUDIO=\"aac\",SUBTITLES=\"subs\",CLOSED-CAPTIONS=\"cc\"
sd.m3u8
#EXT-X-STREAM-INF:BANDWIDTH=3000000,CODECS=\"avc1.640028,mp4a.40.2\",AUDIO=\"aac\",SUBTITLES=\"subs\",CLOSED-CAPTIONS=NONE
hd.m3u8
";

fn lines_with<'a>(text: &'a str, needle: &str) -> Vec<&'a str> {
    text.lines().filter(|l| l.contains(needle)).collect()
}

// ---- HLS ----

#[test]
fn tags_an_ffmpeg_playlist() {
    let tagged = tag_hls(FFMPEG, &master_url(), &two()).unwrap();
    assert_eq!(tagged, FFMPEG_TAGGED);
}

#[test]
fn tagging_twice_equals_tagging_once() {
    for playlist in [FFMPEG, RENDITIONS] {
        for options in [two(), three()] {
            let once = tag_hls(playlist, &master_url(), &options).unwrap();
            let twice = tag_hls(&once, &master_url(), &options).unwrap();
            assert_eq!(once, twice);
        }
    }
}

#[test]
fn a_group_named_like_a_tagged_one_stays_apart() {
    // Found by fuzz/tag_manifests: only the cdn-b copies are tagged, so `aud-cdn-a` is a group
    // of its own and `aud-cdn-b` is `aud` on cdn-b.
    let playlist = "#EXTM3U\n\
        #EXT-X-MEDIA:TYPE=AUDIO,GROUP-ID=\"aud-cdn-a\",NAME=\"x\",URI=\"x.m3u8\"\n\
        #EXT-X-MEDIA:TYPE=AUDIO,GROUP-ID=\"aud-cdn-b\",NAME=\"a\",URI=\"a.m3u8\"\n\
        #EXT-X-STREAM-INF:BANDWIDTH=1,AUDIO=\"aud-cdn-b\",PATHWAY-ID=\"cdn-b\"\n\
        v.m3u8\n";
    let once = tag_hls(playlist, &master_url(), &two()).unwrap();
    assert!(
        once.contains("AUDIO=\"aud-cdn-a\",PATHWAY-ID=\"cdn-a\""),
        "{once}"
    );
    assert!(once.contains("GROUP-ID=\"aud-cdn-a-cdn-a\""), "{once}");
    assert_eq!(tag_hls(&once, &master_url(), &two()).unwrap(), once);
}

#[test]
fn a_variant_naming_another_pathways_group_gets_its_own() {
    // Found by fuzz/tag_manifests: a cdn-b variant names cdn-a's copy of the group.
    let playlist = "#EXTM3U\n\
        #EXT-X-MEDIA:TYPE=AUDIO,GROUP-ID=\"aud-cdn-a\",NAME=\"a\",URI=\"https://a.example.net/vod/a.m3u8\"\n\
        #EXT-X-MEDIA:TYPE=AUDIO,GROUP-ID=\"aud-cdn-b\",NAME=\"a\",URI=\"https://b.example.net/edge/vod/a.m3u8\"\n\
        #EXT-X-STREAM-INF:BANDWIDTH=1,AUDIO=\"aud-cdn-a\",PATHWAY-ID=\"cdn-b\"\n\
        https://b.example.net/edge/vod/v.m3u8\n\
        #EXT-X-STREAM-INF:BANDWIDTH=1,AUDIO=\"aud-cdn-a\",PATHWAY-ID=\"cdn-a\"\n\
        https://a.example.net/vod/v.m3u8\n";
    let once = tag_hls(playlist, &master_url(), &two()).unwrap();
    assert!(
        once.contains("AUDIO=\"aud-cdn-b\",PATHWAY-ID=\"cdn-b\""),
        "{once}"
    );
    assert!(
        once.contains("AUDIO=\"aud-cdn-a\",PATHWAY-ID=\"cdn-a\""),
        "{once}"
    );
    assert_eq!(tag_hls(&once, &master_url(), &two()).unwrap(), once);
    // Untagged, a reference to an undefined `<group>-<pathway>` means the group.
    let untagged = "#EXTM3U\n#EXT-X-MEDIA:TYPE=AUDIO,GROUP-ID=\"aud\",NAME=\"a\"\n\
        #EXT-X-STREAM-INF:BANDWIDTH=1,AUDIO=\"aud-cdn-b\"\nv.m3u8\n";
    let once = tag_hls(untagged, &master_url(), &two()).unwrap();
    assert!(
        once.contains("AUDIO=\"aud-cdn-a\",PATHWAY-ID=\"cdn-a\""),
        "{once}"
    );
    assert_eq!(tag_hls(&once, &master_url(), &two()).unwrap(), once);
}

#[test]
fn a_uri_without_a_path_lands_at_the_pathway_root() {
    // Found by fuzz/tag_manifests: a non-special scheme leaves the path empty.
    let playlist = "#EXTM3U\n#EXT-X-STREAM-INF:BANDWIDTH=1\nqttps://o.example.com#frag\n";
    let once = tag_hls(playlist, &master_url(), &two()).unwrap();
    assert!(once.contains("\nhttps://a.example.net/#frag\n"), "{once}");
    assert!(
        once.contains("\nhttps://b.example.net/edge/#frag\n"),
        "{once}"
    );
    assert_eq!(tag_hls(&once, &master_url(), &two()).unwrap(), once);
}

#[test]
fn stray_carriage_returns_read_back_the_same() {
    // Found by fuzz/tag_manifests: `\r\r\n` inside an LF playlist, and an LF line inside a
    // CRLF one, must not change how the tagged playlist's lines end.
    for playlist in [
        "#EXTM3U\n# odd\r\r\n#EXT-X-STREAM-INF:BANDWIDTH=1\nv.m3u8\n",
        "#EXTM3U\r\n# odd\r\r\n# lf\n#EXT-X-STREAM-INF:BANDWIDTH=1\r\nv.m3u8\r\n",
    ] {
        let once = tag_hls(playlist, &master_url(), &two()).unwrap();
        assert_eq!(
            tag_hls(&once, &master_url(), &two()).unwrap(),
            once,
            "{playlist:?}"
        );
    }
}

#[test]
fn retagging_with_other_pathways_equals_tagging_the_original() {
    // The first pathway of the tagged playlist is still configured: its copies are the content.
    let tagged = tag_hls(FFMPEG, &master_url(), &two()).unwrap();
    let mut moved = three();
    moved.pathways.swap(1, 2);
    assert_eq!(
        tag_hls(&tagged, &master_url(), &moved).unwrap(),
        tag_hls(FFMPEG, &master_url(), &moved).unwrap()
    );
}

#[test]
fn each_pathways_variants_use_that_pathways_groups() {
    let tagged = tag_hls(RENDITIONS, &master_url(), &three()).unwrap();
    for p in ["cdn-a", "cdn-b", "cdn-c"] {
        let variants: Vec<&str> = lines_with(&tagged, &format!("PATHWAY-ID=\"{p}\""))
            .into_iter()
            .filter(|l| l.starts_with("#EXT-X-STREAM-INF:"))
            .collect();
        assert_eq!(variants.len(), 2, "{tagged}");
        assert!(variants[0].contains(&format!("AUDIO=\"aac-{p}\"")));
        assert!(variants[0].contains(&format!("SUBTITLES=\"subs-{p}\"")));
        assert!(variants[0].contains(&format!("CLOSED-CAPTIONS=\"cc-{p}\"")));
        assert!(
            variants[1].contains("CLOSED-CAPTIONS=NONE"),
            "{}",
            variants[1]
        );
        // Two audio renditions, one subtitle, one caption group per pathway.
        assert_eq!(
            lines_with(&tagged, &format!("GROUP-ID=\"aac-{p}\"")).len(),
            2
        );
        assert_eq!(
            lines_with(&tagged, &format!("GROUP-ID=\"subs-{p}\"")).len(),
            1
        );
        assert_eq!(
            lines_with(&tagged, &format!("GROUP-ID=\"cc-{p}\"")).len(),
            1
        );
    }
    // A quoted NAME with a comma survives; the caption group has no URI to move.
    assert!(tagged.contains(
        "#EXT-X-MEDIA:TYPE=AUDIO,GROUP-ID=\"aac-cdn-c\",LANGUAGE=\"en\",NAME=\"English, stereo\",DEFAULT=YES,URI=\"https://c.example.net:8443/vod/en/aac.m3u8\""
    ));
    assert!(tagged.contains(
        "#EXT-X-MEDIA:TYPE=CLOSED-CAPTIONS,GROUP-ID=\"cc-cdn-b\",NAME=\"CC1\",INSTREAM-ID=\"CC1\"\n"
    ));
    assert!(tagged.contains("URI=\"https://b.example.net/edge/vod/fr/aac.m3u8\""));
    // Other lines pass through, once.
    assert_eq!(lines_with(&tagged, "# a comment stays").len(), 1);
    assert_eq!(lines_with(&tagged, "#EXT-X-SESSION-DATA").len(), 1);
    assert!(tagged.starts_with(
        "#EXTM3U\n#EXT-X-CONTENT-STEERING:SERVER-URI=\"https://steer.example.com/v1/hls.json?content=vod\",PATHWAY-ID=\"cdn-b\"\n"
    ));
}

#[test]
fn an_existing_steering_tag_and_pathway_ids_are_replaced() {
    let playlist = "#EXTM3U\n#EXT-X-VERSION:7\n#EXT-X-INDEPENDENT-SEGMENTS\n\
        #EXT-X-CONTENT-STEERING:SERVER-URI=\"/old.json\",PATHWAY-ID=\"old\"\n\
        #EXT-X-STREAM-INF:BANDWIDTH=1000,PATHWAY-ID=\"old\"\n\
        https://old.example.org/live/a.m3u8?x=1\n";
    let tagged = tag_hls(playlist, &master_url(), &two()).unwrap();
    assert_eq!(
        tagged,
        "#EXTM3U\n#EXT-X-VERSION:7\n\
         #EXT-X-CONTENT-STEERING:SERVER-URI=\"https://steer.example.com/v1/hls.json?content=vod\",PATHWAY-ID=\"cdn-a\"\n\
         #EXT-X-INDEPENDENT-SEGMENTS\n\
         #EXT-X-STREAM-INF:BANDWIDTH=1000,PATHWAY-ID=\"cdn-a\"\n\
         https://a.example.net/live/a.m3u8?x=1\n\
         #EXT-X-STREAM-INF:BANDWIDTH=1000,PATHWAY-ID=\"cdn-b\"\n\
         https://b.example.net/edge/live/a.m3u8?x=1\n"
    );
}

#[test]
fn keeps_crlf_line_endings_and_comments_before_a_uri() {
    let playlist = "#EXTM3U\r\n#EXT-X-STREAM-INF:BANDWIDTH=1000\r\n# low\r\nlow.m3u8\r\n";
    let tagged = tag_hls(playlist, &master_url(), &two()).unwrap();
    assert_eq!(
        tagged,
        "#EXTM3U\r\n\
         #EXT-X-CONTENT-STEERING:SERVER-URI=\"https://steer.example.com/v1/hls.json?content=vod\",PATHWAY-ID=\"cdn-a\"\r\n\
         # low\r\n\
         #EXT-X-STREAM-INF:BANDWIDTH=1000,PATHWAY-ID=\"cdn-a\"\r\n\
         https://a.example.net/vod/low.m3u8\r\n\
         #EXT-X-STREAM-INF:BANDWIDTH=1000,PATHWAY-ID=\"cdn-b\"\r\n\
         https://b.example.net/edge/vod/low.m3u8\r\n"
    );
}

#[test]
fn a_relative_server_uri_is_written_as_given() {
    let mut options = two();
    options.server_uri = "steering/hls.json".into();
    let tagged = tag_hls(FFMPEG, &master_url(), &options).unwrap();
    assert!(tagged.contains(
        "#EXT-X-CONTENT-STEERING:SERVER-URI=\"steering/hls.json\",PATHWAY-ID=\"cdn-a\"\n"
    ));
}

#[test]
fn names_what_is_not_a_multivariant_playlist() {
    let media = "#EXTM3U\n#EXT-X-VERSION:3\n#EXT-X-TARGETDURATION:6\n#EXTINF:6.0,\nseg0.ts\n";
    assert_eq!(
        tag_hls(media, &master_url(), &two()).unwrap_err(),
        TagError::MediaPlaylist {
            line: 3,
            tag: "#EXT-X-TARGETDURATION".into()
        }
    );
    let err = tag_hls("<html>oops</html>", &master_url(), &two()).unwrap_err();
    assert!(
        matches!(err, TagError::NotPlaylist { line: 1, .. }),
        "{err}"
    );
    assert!(err.to_string().contains("<html>"), "{err}");
    assert!(matches!(
        tag_hls("", &master_url(), &two()).unwrap_err(),
        TagError::NotPlaylist { line: 1, .. }
    ));
    assert!(matches!(
        tag_hls("\u{feff}#EXTM3U\n", &master_url(), &two()).unwrap_err(),
        TagError::NotPlaylist { line: 1, .. }
    ));
    assert_eq!(
        tag_hls("#EXTM3U\n#EXT-X-VERSION:3\n", &master_url(), &two()).unwrap_err(),
        TagError::NoVariant
    );
    assert_eq!(
        tag_hls(
            "#EXTM3U\n#EXT-X-STREAM-INF:BANDWIDTH=1\n#EXT-X-STREAM-INF:BANDWIDTH=2\na.m3u8\n",
            &master_url(),
            &two()
        )
        .unwrap_err(),
        TagError::MissingUri { line: 2 }
    );
    assert_eq!(
        tag_hls(
            "#EXTM3U\n\n#EXT-X-STREAM-INF:BANDWIDTH=1\n",
            &master_url(),
            &two()
        )
        .unwrap_err(),
        TagError::MissingUri { line: 3 }
    );
}

#[test]
fn names_the_line_of_a_bad_attribute_list() {
    let cases = [
        ("CODECS=\"avc1,mp4a", "not closed"),
        ("BANDWIDTH=1,,RESOLUTION=1x1", "no name"),
        ("BANDWIDTH", "no value"),
        ("BANDWIDTH=", "empty value"),
        ("BANDWIDTH=1,", "ends with a comma"),
        ("NAME=\"a\"b", "after the quoted value"),
        ("BANDWIDTH=1,BANDWIDTH=2", "appears twice"),
        ("BAND WIDTH=1", "is not A-Z"),
        ("NAME=a\"b\"", "double quote"),
    ];
    for (attrs, says) in cases {
        let playlist = format!("#EXTM3U\n#EXT-X-VERSION:3\n#EXT-X-STREAM-INF:{attrs}\na.m3u8\n");
        let err = tag_hls(&playlist, &master_url(), &two()).unwrap_err();
        assert!(
            matches!(&err, TagError::Attributes { line: 3, tag, .. } if tag == "#EXT-X-STREAM-INF"),
            "{attrs}: {err}"
        );
        assert!(err.to_string().contains(says), "{attrs}: {err}");
    }
    let no_group =
        "#EXTM3U\n#EXT-X-MEDIA:TYPE=AUDIO,NAME=\"x\"\n#EXT-X-STREAM-INF:BANDWIDTH=1\na\n";
    assert!(matches!(
        tag_hls(no_group, &master_url(), &two()).unwrap_err(),
        TagError::Attributes { line: 2, .. }
    ));
    // Found by fuzz/tag_manifests: an empty group cannot be told apart from its copies.
    let empty_group = "#EXTM3U\n#EXT-X-STREAM-INF:BANDWIDTH=1\na\n#EXT-X-MEDIA:TYPE=AUDIO,GROUP-ID=\"\",NAME=\"x\"\n";
    assert!(matches!(
        tag_hls(empty_group, &master_url(), &two()).unwrap_err(),
        TagError::Attributes { line: 4, .. }
    ));
    let no_uri =
        "#EXTM3U\n#EXT-X-STREAM-INF:BANDWIDTH=1\na\n#EXT-X-I-FRAME-STREAM-INF:BANDWIDTH=1\n";
    assert!(matches!(
        tag_hls(no_uri, &master_url(), &two()).unwrap_err(),
        TagError::Attributes { line: 4, .. }
    ));
    let unhosted = "#EXTM3U\n#EXT-X-STREAM-INF:BANDWIDTH=1\ndata:text/plain,x\n";
    assert!(matches!(
        tag_hls(unhosted, &master_url(), &two()).unwrap_err(),
        TagError::Uri { line: 3, .. }
    ));
}

#[test]
fn refuses_bad_options() {
    let check = |change: &dyn Fn(&mut TagOptions), expect: &dyn Fn(&TagError) -> bool| {
        let mut options = two();
        change(&mut options);
        let err = tag_hls(FFMPEG, &master_url(), &options).unwrap_err();
        assert!(expect(&err), "{err}");
        assert_eq!(
            tag_dash(SEGMENT_TEMPLATE, &mpd_url(), &options).unwrap_err(),
            err
        );
    };
    check(&|o| o.pathways.clear(), &|e| *e == TagError::NoPathway);
    check(&|o| o.pathways[1].id = "cdn b".into(), &|e| {
        *e == TagError::PathwayId("cdn b".into())
    });
    check(&|o| o.pathways[1].id = "cdn-a".into(), &|e| {
        *e == TagError::DuplicatePathway("cdn-a".into())
    });
    check(
        &|o| o.default_pathway = "cdn-z".into(),
        &|e| matches!(e, TagError::UnknownDefault { default, known } if default == "cdn-z" && known == "cdn-a, cdn-b"),
    );
    check(&|o| o.server_uri = "  ".into(), &|e| {
        matches!(
            e,
            TagError::ServerUri {
                reason: "is empty",
                ..
            }
        )
    });
    check(
        &|o| o.server_uri = "https://s/\"x".into(),
        &|e| matches!(e, TagError::ServerUri { reason, .. } if reason.contains("double quote")),
    );
    check(
        &|o| o.server_uri = "https://s/\nx".into(),
        &|e| matches!(e, TagError::ServerUri { reason, .. } if reason.contains("line break")),
    );
    check(
        &|o| o.pathways[0].base = url("ftp://a.example.net/"),
        &|e| matches!(e, TagError::PathwayBase { id, .. } if id == "cdn-a"),
    );
    check(
        &|o| o.pathways[0].base = url("https://a.example.net/?k=v"),
        &|e| matches!(e, TagError::PathwayBase { reason, .. } if reason.contains("query")),
    );
    check(
        &|o| o.pathways[0].base = url("https://u:p@a.example.net/"),
        &|e| matches!(e, TagError::PathwayBase { reason, .. } if reason.contains("credentials")),
    );
}

#[test]
fn options_from_the_policies() {
    let standby = Policy::load(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../examples/policy-standby.yaml"
    ))
    .unwrap();
    let options = TagOptions::from_policy(&standby, "/steer/hls.json").unwrap();
    assert_eq!(
        options,
        TagOptions {
            server_uri: "/steer/hls.json".into(),
            // cloudflare comes first in id order but is the standby.
            default_pathway: "fastly".into(),
            pathways: vec![
                pathway("cloudflare", "https://example.cdn.cloudflare.net/"),
                pathway("fastly", "https://example.map.fastly.net/"),
            ],
        }
    );
    let live = Policy::load(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../examples/policy.yaml"
    ))
    .unwrap();
    assert_eq!(
        TagOptions::from_policy(&live, "/steer/hls.json")
            .unwrap()
            .default_pathway,
        "cloudflare"
    );
    assert!(matches!(
        TagOptions::from_policy(&live, "bad\"uri").unwrap_err(),
        TagError::ServerUri { .. }
    ));
}

// ---- DASH ----

fn mpd_url() -> Url {
    url("https://origin.example.com/vod/manifest.mpd?session=1")
}

fn dash_options() -> TagOptions {
    let mut o = two();
    o.server_uri = "https://steer.example.com/v1/dash.json?content=vod&x=1".into();
    o
}

/// What `ffmpeg -f dash` writes (SegmentTemplate, no BaseURL).
const SEGMENT_TEMPLATE: &str = r#"<?xml version="1.0" encoding="utf-8"?>
<MPD xmlns:xsi="http://www.w3.org/2001/XMLSchema-instance"
	xmlns="urn:mpeg:dash:schema:mpd:2011"
	xmlns:xlink="http://www.w3.org/1999/xlink"
	xsi:schemaLocation="urn:mpeg:DASH:schema:MPD:2011 http://standards.iso.org/ittf/PubliclyAvailableStandards/MPEG-DASH_schema_files/DASH-MPD.xsd"
	profiles="urn:mpeg:dash:profile:isoff-live:2011"
	type="static"
	mediaPresentationDuration="PT44.6S"
	maxSegmentDuration="PT4.0S"
	minBufferTime="PT9.4S">
	<ProgramInformation>
	</ProgramInformation>
	<ServiceDescription id="0">
	</ServiceDescription>
	<Period id="0" start="PT0.0S">
		<AdaptationSet id="0" contentType="video" startWithSAP="1" segmentAlignment="true" bitstreamSwitching="true" frameRate="30/1" maxWidth="854" maxHeight="480" par="16:9" lang="und">
			<Representation id="0" mimeType="video/mp4" codecs="avc1.64001f" bandwidth="3000000" width="854" height="480" sar="1280:1281">
				<SegmentTemplate timescale="15360" initialization="init-stream$RepresentationID$.m4s" media="chunk-stream$RepresentationID$-$Number%05d$.m4s" startNumber="1">
					<SegmentTimeline>
						<S t="0" d="61440" />
						<S d="94720" r="2" />
					</SegmentTimeline>
				</SegmentTemplate>
			</Representation>
		</AdaptationSet>
		<AdaptationSet id="1" contentType="audio" startWithSAP="1" segmentAlignment="true" bitstreamSwitching="true" lang="und">
			<Representation id="1" mimeType="audio/mp4" codecs="mp4a.40.2" bandwidth="128000" audioSamplingRate="48000">
				<AudioChannelConfiguration schemeIdUri="urn:mpeg:dash:23003:3:audio_channel_configuration:2011" value="2" />
				<SegmentTemplate timescale="48000" initialization="init-stream$RepresentationID$.m4s" media="chunk-stream$RepresentationID$-$Number%05d$.m4s" startNumber="1" duration="192000" />
			</Representation>
		</AdaptationSet>
	</Period>
</MPD>
"#;

const STEERING_DASH: &str = "<ContentSteering defaultServiceLocation=\"cdn-a\" queryBeforeStart=\"true\">https://steer.example.com/v1/dash.json?content=vod&amp;x=1</ContentSteering>";

#[test]
fn tags_an_ffmpeg_mpd_after_its_program_information() {
    let tagged = tag_dash(SEGMENT_TEMPLATE, &mpd_url(), &dash_options()).unwrap();
    let inserted = format!(
        "</ProgramInformation>\n\t<BaseURL serviceLocation=\"cdn-a\">https://a.example.net/vod/</BaseURL>\
         \n\t<BaseURL serviceLocation=\"cdn-b\">https://b.example.net/edge/vod/</BaseURL>\n\t{STEERING_DASH}"
    );
    assert_eq!(
        tagged,
        SEGMENT_TEMPLATE.replace("</ProgramInformation>", &inserted)
    );
    assert_eq!(
        tag_dash(&tagged, &mpd_url(), &dash_options()).unwrap(),
        tagged
    );
}

/// An MPD with an MPD-level BaseURL, a Location, an old ContentSteering and a Period-level
/// BaseURL (which stays).
const WITH_BASE: &str = r#"<?xml version="1.0"?>
<!-- packaged by the origin -->
<MPD xmlns="urn:mpeg:dash:schema:mpd:2011" type="dynamic" profiles="urn:mpeg:dash:profile:isoff-live:2011" minBufferTime="PT2S" availabilityStartTime="2026-01-01T00:00:00Z">
  <BaseURL>https://origin.example.com/live/channel1/</BaseURL>
  <BaseURL>https://backup.example.com/live/channel1/</BaseURL>
  <ContentSteering defaultServiceLocation="x">https://old/steer</ContentSteering>
  <Location>https://origin.example.com/live/channel1/manifest.mpd</Location>
  <Period id="p0" start="PT0S">
    <BaseURL>period0/</BaseURL>
    <AdaptationSet mimeType="video/mp4" segmentAlignment="true">
      <SegmentTemplate media="$RepresentationID$/$Number$.m4s" initialization="$RepresentationID$/init.mp4" duration="2" startNumber="1"/>
      <Representation id="v1" bandwidth="2000000" width="1280" height="720" codecs="avc1.64001f"/>
    </AdaptationSet>
  </Period>
  <UTCTiming schemeIdUri="urn:mpeg:dash:utc:http-iso:2014" value="https://time.example.com/?iso&amp;ms"/>
</MPD>"#;

#[test]
fn replaces_an_existing_base_url_and_steering() {
    let tagged = tag_dash(WITH_BASE, &mpd_url(), &dash_options()).unwrap();
    let expected = WITH_BASE
        .replace(
            "\n  <BaseURL>https://origin.example.com/live/channel1/</BaseURL>\n  <BaseURL>https://backup.example.com/live/channel1/</BaseURL>\n  <ContentSteering defaultServiceLocation=\"x\">https://old/steer</ContentSteering>",
            &format!(
                "\n  <BaseURL serviceLocation=\"cdn-a\">https://a.example.net/live/channel1/</BaseURL>\
                 \n  <BaseURL serviceLocation=\"cdn-b\">https://b.example.net/edge/live/channel1/</BaseURL>\n  {STEERING_DASH}"
            ),
        );
    assert_eq!(tagged, expected);
    assert!(tagged.contains("<BaseURL>period0/</BaseURL>"));
    assert_eq!(
        tag_dash(&tagged, &mpd_url(), &dash_options()).unwrap(),
        tagged
    );
    // Tagging with three pathways from the tagged MPD equals tagging the original.
    let mut more = three();
    more.server_uri = "/steer".into();
    assert_eq!(
        tag_dash(&tagged, &mpd_url(), &more).unwrap(),
        tag_dash(WITH_BASE, &mpd_url(), &more).unwrap()
    );
}

/// Found by the fuzzer: indentation of characters `str::trim` calls whitespace and XML does
/// not (a vertical tab). The old elements' removal takes only XML whitespace with it, so the
/// separator must be XML whitespace too, or every tagging leaves one more blank line.
#[test]
fn indentation_that_is_not_xml_whitespace_does_not_pile_up() {
    let mpd = "<MPD xmlns=\"urn:mpeg:dash:schema:mpd:2011\">\n \u{b}\u{b}<Period/>\n</MPD>";
    let tagged = tag_dash(mpd, &mpd_url(), &dash_options()).unwrap();
    assert!(
        tagged.starts_with(
            "<MPD xmlns=\"urn:mpeg:dash:schema:mpd:2011\"><BaseURL serviceLocation=\"cdn-a\">"
        ),
        "{tagged}"
    );
    let again = tag_dash(&tagged, &mpd_url(), &dash_options()).unwrap();
    assert_eq!(again, tagged);
    // XML whitespace indents as before.
    let spaced = tag_dash(&mpd.replace('\u{b}', " "), &mpd_url(), &dash_options()).unwrap();
    assert!(
        spaced.contains(">\n   <BaseURL serviceLocation=\"cdn-a\">"),
        "{spaced}"
    );
    // Outside the root it is text, not whitespace.
    let outside = format!("{mpd}\u{b}");
    assert!(matches!(
        tag_dash(&outside, &mpd_url(), &dash_options()),
        Err(TagError::Xml { .. })
    ));
}

/// Found by the fuzzer: the whitespace before the first child went with a `BaseURL` the
/// tagging replaced, so retagging read its separator elsewhere. The separator is the
/// whitespace before the first element replaced, which a tagged MPD keeps.
#[test]
fn the_separator_survives_the_removal_of_the_element_it_was_read_before() {
    let mpd = "<MPD xmlns=\"urn:mpeg:dash:schema:mpd:2011\">\n  <BaseURL/>text\n\t<ProgramInformation/>\n  <Period/>\n</MPD>";
    let tagged = tag_dash(mpd, &mpd_url(), &dash_options()).unwrap();
    assert!(
        tagged.contains("<ProgramInformation/>\n  <BaseURL serviceLocation=\"cdn-a\">"),
        "{tagged}"
    );
    assert_eq!(
        tag_dash(&tagged, &mpd_url(), &dash_options()).unwrap(),
        tagged
    );
}

#[test]
fn a_relative_base_url_resolves_against_the_manifest() {
    let mpd =
        "<MPD xmlns=\"urn:mpeg:dash:schema:mpd:2011\"><BaseURL>media/?v=2</BaseURL><Period/></MPD>";
    let tagged = tag_dash(mpd, &mpd_url(), &dash_options()).unwrap();
    assert_eq!(
        tagged,
        format!(
            "<MPD xmlns=\"urn:mpeg:dash:schema:mpd:2011\">\
             <BaseURL serviceLocation=\"cdn-a\">https://a.example.net/vod/media/?v=2</BaseURL>\
             <BaseURL serviceLocation=\"cdn-b\">https://b.example.net/edge/vod/media/?v=2</BaseURL>\
             {STEERING_DASH}<Period/></MPD>"
        )
    );
    assert_eq!(
        tag_dash(&tagged, &mpd_url(), &dash_options()).unwrap(),
        tagged
    );
}

#[test]
fn keeps_the_namespace_prefix() {
    let mpd = "<?xml version=\"1.0\"?>\n<mpd:MPD xmlns:mpd=\"urn:mpeg:dash:schema:mpd:2011\" profiles=\"p\" minBufferTime=\"PT2S\">\n  \
               <mpd:BaseURL serviceLocation=\"old\">http://origin.example.com/a&amp;b/</mpd:BaseURL>\n  \
               <mpd:Period><mpd:BaseURL>keep/</mpd:BaseURL></mpd:Period>\n</mpd:MPD>\n";
    let tagged = tag_dash(mpd, &mpd_url(), &dash_options()).unwrap();
    assert_eq!(
        tagged,
        "<?xml version=\"1.0\"?>\n<mpd:MPD xmlns:mpd=\"urn:mpeg:dash:schema:mpd:2011\" profiles=\"p\" minBufferTime=\"PT2S\">\n  \
         <mpd:BaseURL serviceLocation=\"cdn-a\">https://a.example.net/a&amp;b/</mpd:BaseURL>\n  \
         <mpd:BaseURL serviceLocation=\"cdn-b\">https://b.example.net/edge/a&amp;b/</mpd:BaseURL>\n  \
         <mpd:ContentSteering defaultServiceLocation=\"cdn-a\" queryBeforeStart=\"true\">https://steer.example.com/v1/dash.json?content=vod&amp;x=1</mpd:ContentSteering>\n  \
         <mpd:Period><mpd:BaseURL>keep/</mpd:BaseURL></mpd:Period>\n</mpd:MPD>\n"
    );
    assert_eq!(
        tag_dash(&tagged, &mpd_url(), &dash_options()).unwrap(),
        tagged
    );
}

#[test]
fn an_empty_mpd_element_gets_children() {
    let tagged = tag_dash("<MPD profiles=\"p\"/>", &mpd_url(), &dash_options()).unwrap();
    assert_eq!(
        tagged,
        format!(
            "<MPD profiles=\"p\"><BaseURL serviceLocation=\"cdn-a\">https://a.example.net/vod/</BaseURL>\
             <BaseURL serviceLocation=\"cdn-b\">https://b.example.net/edge/vod/</BaseURL>{STEERING_DASH}</MPD>"
        )
    );
    assert_eq!(
        tag_dash(&tagged, &mpd_url(), &dash_options()).unwrap(),
        tagged
    );
}

#[test]
fn names_what_is_not_an_mpd() {
    let o = dash_options();
    assert_eq!(
        tag_dash(
            "<?xml version=\"1.0\"?>\n<html><body/></html>",
            &mpd_url(),
            &o
        )
        .unwrap_err(),
        TagError::NotMpd {
            line: 2,
            found: "html".into()
        }
    );
    assert_eq!(
        tag_dash("<dash:Manifest xmlns:dash=\"x\"/>", &mpd_url(), &o).unwrap_err(),
        TagError::NotMpd {
            line: 1,
            found: "dash:Manifest".into()
        }
    );
    assert_eq!(
        tag_dash("<!-- nothing -->\n", &mpd_url(), &o).unwrap_err(),
        TagError::NoRoot
    );
    assert_eq!(tag_dash("", &mpd_url(), &o).unwrap_err(), TagError::NoRoot);
    let malformed = [
        ("<MPD>\n  <Period>\n  </Perio>\n</MPD>", 3),
        ("<MPD>\n<Period>\n", 3),
        ("<MPD>\n<Period></Period>", 2),
        ("<MPD></MPD>\n<MPD></MPD>", 2),
        ("<MPD></MPD>\ntrailing text", 2),
        ("<MPD><BaseURL>&nbsp;</BaseURL></MPD>", 1),
        (
            "<MPD a=\"1\" a=\"2\"><BaseURL x='1' x='2'>u</BaseURL></MPD>",
            1,
        ),
        ("<MPD\n\n attr=>", 1),
    ];
    for (mpd, line) in malformed {
        let err = tag_dash(mpd, &mpd_url(), &o).unwrap_err();
        assert!(
            matches!(err, TagError::Xml { line: l, .. } if l == line),
            "{mpd:?}: {err:?}"
        );
    }
    let unhosted = "<MPD>\n<BaseURL>urn:example:thing</BaseURL></MPD>";
    assert!(matches!(
        tag_dash(unhosted, &mpd_url(), &o).unwrap_err(),
        TagError::BaseUrl { line: 2, .. }
    ));
    assert!(matches!(
        tag_dash("<MPD/>", &url("data:text/plain,x"), &o).unwrap_err(),
        TagError::ManifestUrl { .. }
    ));
}

// ---- Properties ----

fn variant_uri() -> impl Strategy<Value = String> {
    (
        prop::sample::select(vec![
            "",
            "/vod/",
            "../",
            "https://origin.example.com/",
            "http://other.example.org:8080/x/",
        ]),
        "[a-z0-9]{1,8}(/[a-z0-9_-]{1,8}){0,2}",
        prop::option::of("[a-z]{1,4}=[a-z0-9]{1,6}"),
    )
        .prop_map(|(prefix, path, query)| match query {
            Some(q) => format!("{prefix}{path}.m3u8?{q}"),
            None => format!("{prefix}{path}.m3u8"),
        })
}

fn pathways() -> impl Strategy<Value = Vec<Pathway>> {
    prop::sample::subsequence(
        vec![
            ("cdn-a", "https://a.example.net/"),
            ("CDN_B", "https://b.example.net/p/"),
            ("c.3", "http://c.example.net:8080/"),
            ("d", "https://d.example.net/x/y/"),
        ],
        1..=4,
    )
    .prop_shuffle()
    .prop_map(|list| {
        list.into_iter()
            .map(|(id, base)| pathway(id, base))
            .collect()
    })
}

proptest! {
    #[test]
    fn every_variant_appears_once_per_pathway_on_its_host(
        uris in prop::collection::vec(variant_uri(), 1..6),
        pathways in pathways(),
        with_audio in any::<bool>(),
    ) {
        let mut playlist = String::from("#EXTM3U\n#EXT-X-VERSION:6\n");
        if with_audio {
            playlist.push_str("#EXT-X-MEDIA:TYPE=AUDIO,GROUP-ID=\"aud\",NAME=\"a, b\",URI=\"audio.m3u8\"\n");
        }
        for (i, uri) in uris.iter().enumerate() {
            let audio = if with_audio { ",AUDIO=\"aud\"" } else { "" };
            playlist.push_str(&format!(
                "#EXT-X-STREAM-INF:BANDWIDTH={},CODECS=\"avc1.4d401f,mp4a.40.2\"{audio}\n{uri}{}v={i}\n",
                100_000 * (i + 1),
                if uri.contains('?') { "&" } else { "?" },
            ));
        }
        let options = TagOptions {
            server_uri: "/steer.json".into(),
            default_pathway: pathways[0].id.clone(),
            pathways: pathways.clone(),
        };
        let base = master_url();
        let tagged = tag_hls(&playlist, &base, &options).unwrap();
        let lines: Vec<&str> = tagged.lines().collect();
        for (i, _) in uris.iter().enumerate() {
            for p in &pathways {
                let copies: Vec<Url> = lines
                    .windows(2)
                    .filter(|w| {
                        w[0].starts_with("#EXT-X-STREAM-INF:")
                            && w[0].contains(&format!("BANDWIDTH={},", 100_000 * (i + 1)))
                            && w[0].ends_with(&format!(",PATHWAY-ID=\"{}\"", p.id))
                    })
                    .map(|w| url(w[1]))
                    .collect();
                prop_assert_eq!(copies.len(), 1, "{}", tagged);
                let copy = &copies[0];
                prop_assert_eq!(copy.host_str(), p.base.host_str());
                prop_assert_eq!(copy.port(), p.base.port());
                prop_assert!(copy.path().starts_with(p.base.path()), "{}", copy);
                let original = base.join(&uris[i]).unwrap();
                let prefix = p.base.path().trim_end_matches('/');
                prop_assert_eq!(copy.path(), format!("{prefix}{}", original.path()));
                let v = format!("v={i}");
                prop_assert!(copy.query().unwrap_or("").ends_with(&v), "{}", copy);
                if with_audio {
                    let audio = format!("AUDIO=\"aud-{}\"", p.id);
                    let id = format!("PATHWAY-ID=\"{}\"", p.id);
                    let uses_own = lines.iter().any(|l| l.starts_with("#EXT-X-STREAM-INF:")
                        && l.contains(&audio)
                        && l.ends_with(&id));
                    prop_assert!(uses_own, "{}", tagged);
                    let group = format!("GROUP-ID=\"aud-{}\"", p.id);
                    prop_assert_eq!(lines.iter().filter(|l| l.contains(&group)).count(), 1);
                }
            }
        }
        prop_assert_eq!(
            lines.iter().filter(|l| l.starts_with("#EXT-X-STREAM-INF:")).count(),
            uris.len() * pathways.len()
        );
        prop_assert_eq!(tag_hls(&tagged, &base, &options).unwrap(), tagged);
    }

    #[test]
    fn no_input_panics(text in "(#EXTM3U\n)?(#EXT[-A-Z]{0,20}(:[-A-Z=\",0-9a-z./]{0,40})?\n|[ -~]{0,30}\n|<[/!?]?[A-Za-z:]{0,8}( [a-z]{1,4}=\"[^\"]{0,10}\")?/?>|&[a-z#0-9]{0,5};){0,30}") {
        let options = two();
        let _ = tag_hls(&text, &master_url(), &options);
        let _ = tag_dash(&text, &mpd_url(), &options);
    }

    #[test]
    fn tagged_mpds_tag_to_themselves(
        base in prop::option::of(prop::sample::select(vec!["media/", "/abs/", "https://o.example.com/r/", "../up/?q=1"])),
        program in any::<bool>(),
        pathways in pathways(),
        indent in prop::sample::select(vec!["", "\n", "\n  ", "\r\n\t"]),
    ) {
        let mut mpd = String::from("<?xml version=\"1.0\"?><MPD xmlns=\"urn:mpeg:dash:schema:mpd:2011\">");
        if program {
            mpd.push_str(&format!("{indent}<ProgramInformation><Title>t</Title></ProgramInformation>"));
        }
        if let Some(base) = base {
            mpd.push_str(&format!("{indent}<BaseURL>{base}</BaseURL>"));
        }
        mpd.push_str(&format!("{indent}<Period><AdaptationSet/></Period>{indent}</MPD>"));
        let options = TagOptions {
            server_uri: "https://s.example.com/d?a=1&b=2".into(),
            default_pathway: pathways[pathways.len() - 1].id.clone(),
            pathways: pathways.clone(),
        };
        let once = tag_dash(&mpd, &mpd_url(), &options).unwrap();
        prop_assert_eq!(&tag_dash(&once, &mpd_url(), &options).unwrap(), &once);
        for p in &pathways {
            let needle = format!("<BaseURL serviceLocation=\"{}\">", p.id);
            prop_assert_eq!(once.matches(&needle).count(), 1, "{}", once);
        }
        prop_assert_eq!(once.matches("<ContentSteering ").count(), 1);
        prop_assert!(once.find("<ContentSteering ") < once.find("<Period>"));
        if program {
            prop_assert!(once.find("</ProgramInformation>") < once.find("<BaseURL"));
        }
    }
}
