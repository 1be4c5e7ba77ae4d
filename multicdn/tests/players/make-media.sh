#!/usr/bin/env bash
# Makes the test clip for multicdn's player test (tests/players.rs) into the directory $1:
# 60 s of ffmpeg's test pattern with a sine tone, in two video rungs (320x180 at 400 kbps and
# 1280x720 at 2000 kbps, H.264 baseline/main) and one AAC track (64 kbps), cut into 2 s fMP4
# (CMAF) segments that both manifests share:
#
#   manifest.mpd          DASH, SegmentTemplate with $Number$ (no timeline)
#   master.m3u8           HLS multivariant playlist
#   media_0.m3u8 ...      HLS media playlists (one per stream)
#   init-stream<N>.m4s, chunk-stream<N>-<00001>.m4s   the segments
#
# ffmpeg's dash muxer writes both manifests in one pass (ultrafast preset: a few seconds).
# The test rewrites the manifests per CDN pathway; the clip itself is the same everywhere.
set -euo pipefail
out="${1:?usage: make-media.sh OUTPUT_DIR}"
seconds="${CLIP_SECONDS:-60}"
mkdir -p "$out"
tmp="$(mktemp -d "$out/.make.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT
(
  cd "$tmp"
  ffmpeg -hide_banner -loglevel error -nostdin -y \
    -f lavfi -i "testsrc=size=1280x720:rate=30:duration=$seconds" \
    -f lavfi -i "sine=frequency=440:sample_rate=48000:duration=$seconds" \
    -map 0:v -map 0:v -map 1:a \
    -c:v libx264 -preset ultrafast -tune zerolatency -pix_fmt yuv420p \
    -g 60 -keyint_min 60 -sc_threshold 0 -force_key_frames 'expr:gte(t,n_forced*2)' \
    -filter:v:0 scale=320:180 -profile:v:0 baseline -level:v:0 3.0 \
      -b:v:0 400k -maxrate:v:0 440k -bufsize:v:0 800k \
    -filter:v:1 scale=1280:720 -profile:v:1 main -level:v:1 3.1 \
      -b:v:1 2000k -maxrate:v:1 2200k -bufsize:v:1 4000k \
    -c:a aac -b:a 64k -ac 2 \
    -f dash -seg_duration 2 -use_template 1 -use_timeline 0 \
    -adaptation_sets 'id=0,streams=v id=1,streams=a' \
    -hls_playlist 1 -streaming 0 \
    manifest.mpd
)
for f in manifest.mpd master.m3u8; do
  [ -s "$tmp/$f" ] || { echo "make-media.sh: ffmpeg wrote no $f" >&2; exit 1; }
done
# Replace the previous clip in one step, so a reader never sees half of one.
find "$out" -maxdepth 1 -type f -delete
mv "$tmp"/* "$out"/
