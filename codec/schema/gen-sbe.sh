#!/usr/bin/env bash
# Regenerates codec/generated/sbe/ from codec/schema/marketdata.xml with real-logic's SBE tool
# (Maven Central uk.co.real-logic:sbe-all, pinned below: the generated code is committed, so every
# run must give the same bytes). Installs Java and Maven from Debian's packages when missing.
#
#   bash codec/schema/gen-sbe.sh      (from the project root, or anywhere)
#
# The tool writes a whole crate; only its sources are kept, as a module of mdrelay-codec (see
# codec/src/sbe.rs), so the workspace has no extra crate. Its modules name their root
# `crate::`, which as a module is `super::`: that is the one edit made to the generated code, and
# lib.rs becomes mod.rs.
set -euo pipefail
cd "$(dirname "$0")/../.."

SBE_VERSION=1.38.1
SCHEMA=codec/schema/marketdata.xml
OUT=codec/generated/sbe

if ! command -v java >/dev/null || ! command -v mvn >/dev/null; then
    echo "installing Java 17 and Maven" >&2
    apt-get update -q
    apt-get install -y -q openjdk-17-jre-headless maven
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# dependency:copy resolves through the local repository (downloading on first use) and puts the jar
# where this script can find it, whatever the local repository's location.
mvn -q -B -Dstyle.color=never dependency:copy -Dartifact="uk.co.real-logic:sbe-all:$SBE_VERSION" -DoutputDirectory="$work/jar" >&2
jar="$work/jar/sbe-all-$SBE_VERSION.jar"

java -Dsbe.target.language=Rust -Dsbe.output.dir="$work/out" -jar "$jar" "$SCHEMA" >&2
generated="$work/out/mdrelay_sbe/src"
[ -f "$generated/lib.rs" ] || { echo "error: the SBE tool wrote no $generated/lib.rs" >&2; exit 1; }

rm -rf "$OUT"
mkdir -p "$OUT"
for file in "$generated"/*.rs; do
    name=$(basename "$file")
    [ "$name" = lib.rs ] && name=mod.rs
    sed -e 's/\bcrate::/super::/g' "$file" >"$OUT/$name"
done
echo "generated $OUT from $SCHEMA with SBE $SBE_VERSION" >&2
