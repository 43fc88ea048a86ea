# Shared by scripts/bench-peer.sh and scripts/quality-peer.sh (sourced): their command line,
# [BUILD_DIR] [--dry-run] [-h], into BUILD and DRY; NAME and HELP_LINES say whose and which lines of
# its header are the help.
BUILD=build; DRY=0
for a in "$@"; do
    case "$a" in
        --dry-run) DRY=1 ;;
        -h|--help) sed -n "$HELP_LINES" "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        -*) echo "$NAME: unknown option '$a'" >&2; exit 2 ;;
        *) BUILD=$a ;;
    esac
done
die() { echo "$NAME: $*" >&2; exit 1; }
