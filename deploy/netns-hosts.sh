#!/usr/bin/env bash
# Emulated hosts on one Linux machine: network namespaces `pub`, `sub1` and `sub2`, wired by two
# bridges (lines A and B) that live in a namespace of their own, so nothing on the machine's own
# network changes. Loss is injected per host and line with nftables, and every datagram it drops is
# counted and remembered by sequence number, so a test can check a subscriber's gap accounting
# against what was really dropped.
#
#   deploy/netns-hosts.sh up                      build the network (tears down an existing one first)
#   deploy/netns-hosts.sh exec HOST CMD...        run CMD on HOST (ip netns exec)
#   deploy/netns-hosts.sh loss HOST PERCENT [a|b] drop PERCENT % of relay DATA datagrams arriving
#                                                 on HOST's line (default a); 0 removes the rule
#   deploy/netns-hosts.sh counter HOST            "a=N b=M": datagrams dropped so far per line
#   deploy/netns-hosts.sh dropped HOST a|b        their relay sequence numbers, sorted, one a line
#   deploy/netns-hosts.sh link HOST a|b up|down   unplug or replug HOST's interface on a line
#   deploy/netns-hosts.sh status                  what exists, addresses, links, loss rules
#   deploy/netns-hosts.sh down                    remove everything (idempotent)
#
# The NATS variant: a nats-server on every host, clustered across line A's bridge.
#   deploy/netns-hosts.sh nats-up DIR             start them (client port 4222 and routes on 6222
#                                                 on each host's line A address, JetStream stores,
#                                                 logs and pids in DIR); returns once each is ready
#                                                 and JetStream has a metadata leader
#   deploy/netns-hosts.sh nats-loss HOST PERCENT PEER
#                                                 drop PERCENT % of the NATS route's TCP segments
#                                                 HOST receives from PEER on line A (0 removes it)
#   deploy/netns-hosts.sh nats-counter HOST       "a=N b=M": route segments dropped so far per line
#   deploy/netns-hosts.sh nats-down DIR           stop the servers started with DIR (idempotent)
# TCP retransmits what is dropped, so loss on a route is delay, never loss, for NATS. nats-server
# comes from PATH or ${MDRELAY_TOOLS:-~/.cache/mdrelay-tools}/bin (`bash .ci/nats.sh` builds it).
#
# Hosts and addresses (interface a0 on line A, b0 on line B, multicast 239.255.0.0/16 via a0):
#   pub  198.18.0.1  198.18.1.1
#   sub1 198.18.0.2  198.18.1.2
#   sub2 198.18.0.3  198.18.1.3
# 198.18.0.0/15 is reserved for benchmarking (RFC 2544), so it cannot clash with a real network
# the machine is on.
#
# MDR_NETNS_PREFIX (default mdr, at most 6 of a-z0-9) names the namespaces: mdr-pub, mdr-sub1,
# mdr-sub2 and the switch mdr-net. Several networks with different prefixes can coexist, which
# lets tests run side by side. Needs root, iproute2 and nftables (installed with apt-get when
# missing).
set -euo pipefail

readonly HOSTS=(pub sub1 sub2)
readonly LINES=(a b)
# The multicast range routed over line A: where the relay's groups come from.
readonly MCAST_RANGE=239.255.0.0/16

prog=${0##*/}
prefix=${MDR_NETNS_PREFIX:-mdr}

usage() {
    cat >&2 <<EOF
usage: $prog up | down | status
       $prog exec HOST CMD [ARG...]
       $prog loss HOST PERCENT [LINE]
       $prog counter HOST
       $prog dropped HOST LINE
       $prog link HOST LINE up|down
       $prog nats-up DIR | nats-down DIR
       $prog nats-loss HOST PERCENT PEER
       $prog nats-counter HOST
HOST and PEER are pub, sub1 or sub2; LINE is a (198.18.0.0/24, the default) or b (198.18.1.0/24);
PERCENT is a whole number from 0 (no loss: the rule is removed) to 100.
MDR_NETNS_PREFIX (now "$prefix") names the namespaces: \$MDR_NETNS_PREFIX-pub and so on.
EOF
    exit 2
}

die() {
    echo "$prog: $*" >&2
    exit 1
}

# A bad argument: what is wrong, then the usage.
bad() {
    echo "$prog: $*" >&2
    usage
}

# Interface names are limited to 15 characters and namespace names end up in them in `status`
# output and in people's shell prompts; a short, plain prefix keeps all of that readable.
[[ $prefix =~ ^[a-z0-9]{1,6}$ ]] || die "MDR_NETNS_PREFIX=\"$prefix\": use 1 to 6 characters of a-z and 0-9"
readonly NET="$prefix-net"

check_host() {
    case ${1-} in
        pub | sub1 | sub2) ;;
        *) bad "unknown host \"${1-}\" (hosts: ${HOSTS[*]})" ;;
    esac
}

check_line() {
    case ${1-} in
        a | b) ;;
        *) bad "unknown line \"${1-}\" (lines: a, b)" ;;
    esac
}

# The host's last address byte, the same on both lines.
host_number() {
    case $1 in
        pub) echo 1 ;;
        sub1) echo 2 ;;
        sub2) echo 3 ;;
    esac
}

# The host's address on a line.
address() {
    local net=0
    [ "$2" = b ] && net=1
    echo "198.18.$net.$(host_number "$1")"
}

ns_of() {
    echo "$prefix-$1"
}

ns_exists() {
    [ -e "/run/netns/$1" ]
}

need_root() {
    [ "$(id -u)" -eq 0 ] || die "must run as root: it creates network namespaces and nftables rules (try: sudo $0 ${*:-up})"
}

# Installs what is missing, as CI and a fresh machine need.
need_tools() {
    local missing=()
    command -v ip >/dev/null || missing+=(iproute2)
    command -v nft >/dev/null || missing+=(nftables)
    [ ${#missing[@]} -eq 0 ] && return
    command -v apt-get >/dev/null || die "missing ${missing[*]}, and there is no apt-get to install it with"
    echo "$prog: installing ${missing[*]}" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y -q "${missing[@]}" >&2 || { apt-get update -q >&2 && apt-get install -y -q "${missing[@]}" >&2; }
}

# The host's namespace, failing with a hint when the network is not up.
host_ns() {
    local ns
    ns=$(ns_of "$1")
    ns_exists "$ns" || die "host $1 does not exist (namespace $ns): run \"$prog up\" first (MDR_NETNS_PREFIX=$prefix)"
    echo "$ns"
}

# Removes the network. Processes still running on an emulated host are ended first: a namespace
# whose name is deleted lives on as long as they do, with its interfaces, out of sight.
teardown() {
    local name ns pids
    for name in "${HOSTS[@]}" net; do
        ns=$(ns_of "$name")
        ns_exists "$ns" || continue
        pids=$(ip netns pids "$ns" 2>/dev/null || true)
        if [ -n "$pids" ]; then
            # shellcheck disable=SC2086 # one pid a word
            kill -TERM $pids 2>/dev/null || true
            for _ in $(seq 20); do
                pids=$(ip netns pids "$ns" 2>/dev/null || true)
                [ -z "$pids" ] && break
                sleep 0.1
            done
            # shellcheck disable=SC2086
            if [ -n "$pids" ]; then kill -KILL $pids 2>/dev/null || true; fi
        fi
        ip netns del "$ns"
    done
}

# The loss machinery of one host, without rules: a counter and a set of sequence numbers per
# line, and a chain per line that `loss` fills. Relay datagram header (UDP payload, little-endian):
# 0..4 magic "MDRU", 6 kind (0 data), 16..24 first frame's sequence. @th counts bits from the
# start of the UDP header, 8 bytes before the payload.
nft_base() {
    cat <<EOF
table inet mdrelay {
    counter drops_a { }
    counter drops_b { }
    counter route_drops_a { }
    counter route_drops_b { }
    set dropped_a { typeof @th,192,64; size 1048576; flags dynamic; }
    set dropped_b { typeof @th,192,64; size 1048576; flags dynamic; }
    chain loss_a { }
    chain loss_b { }
    chain route_loss_a { }
    chain route_loss_b { }
    chain input {
        type filter hook input priority filter; policy accept;
        iifname "a0" meta l4proto udp jump loss_a
        iifname "b0" meta l4proto udp jump loss_b
        iifname "a0" meta l4proto tcp jump route_loss_a
        iifname "b0" meta l4proto tcp jump route_loss_b
    }
}
EOF
}

cmd_up() {
    need_root up
    need_tools
    teardown
    built=0
    # Whatever fails midway, nothing half-built is left behind.
    trap '[ "$built" = 1 ] || { teardown 2>/dev/null || true; echo "$prog: up failed; removed what it had made" >&2; }' EXIT
    trap 'exit 130' INT TERM

    ip netns add "$NET"
    ip -n "$NET" link set lo up
    local line host ns
    for line in "${LINES[@]}"; do
        # No IGMP querier on this network, so a snooping bridge would forward a group to nobody
        # once its membership reports aged out: flood multicast to every port instead, as a plain
        # switch without snooping does.
        ip -n "$NET" link add "br-$line" type bridge stp_state 0 forward_delay 0 mcast_snooping 0
        ip -n "$NET" link set "br-$line" up
    done
    for host in "${HOSTS[@]}"; do
        ns=$(ns_of "$host")
        ip netns add "$ns"
        ip -n "$ns" link set lo up
        for line in "${LINES[@]}"; do
            # Created in the switch namespace, the host's end moved straight into its namespace:
            # no interface ever appears in the machine's own namespace.
            ip -n "$NET" link add "$host-$line" type veth peer name "${line}0" netns "$ns"
            ip -n "$NET" link set "$host-$line" master "br-$line"
            ip -n "$NET" link set "$host-$line" up
            ip -n "$ns" addr add "$(address "$host" "$line")/24" dev "${line}0"
            ip -n "$ns" link set "${line}0" up
        done
        # Strict reverse-path filtering would drop multicast arriving on b0 from a source the
        # routing table sends elsewhere; these are test hosts, so it is off.
        ip netns exec "$ns" sysctl -qw net.ipv4.conf.all.rp_filter=0 net.ipv4.conf.default.rp_filter=0 \
            net.ipv4.conf.a0.rp_filter=0 net.ipv4.conf.b0.rp_filter=0
        ip -n "$ns" route add "$MCAST_RANGE" dev a0
        nft_base | ip netns exec "$ns" nft -f -
    done
    built=1
    trap - EXIT INT TERM
    echo "$prog: up: namespaces $prefix-pub, $prefix-sub1, $prefix-sub2 (hosts) and $NET (switch)" >&2
}

cmd_down() {
    need_root down
    teardown
}

cmd_exec() {
    [ $# -ge 2 ] || bad "exec needs a host and a command"
    check_host "$1"
    need_root exec
    local ns
    ns=$(host_ns "$1")
    shift
    exec ip netns exec "$ns" "$@"
}

cmd_loss() {
    if [ $# -lt 2 ] || [ $# -gt 3 ]; then bad "loss needs a host, a percentage and optionally a line"; fi
    local host=$1 percent=$2 line=${3:-a}
    check_host "$host"
    if ! [[ $percent =~ ^[0-9]{1,3}$ ]] || [ $((10#$percent)) -gt 100 ]; then
        bad "loss: \"$percent\" is not a whole percentage from 0 to 100"
    fi
    percent=$((10#$percent))
    check_line "$line"
    need_root loss
    need_tools
    local ns
    ns=$(host_ns "$host")
    # The old rule goes first, so nothing is dropped between zeroing the record and the new rule.
    ip netns exec "$ns" nft flush chain inet mdrelay "loss_$line"
    ip netns exec "$ns" nft reset counter inet mdrelay "drops_$line" >/dev/null
    ip netns exec "$ns" nft flush set inet mdrelay "dropped_$line"
    [ "$percent" -eq 0 ] && return
    # Only DATA datagrams (kind 0): an END lost would end the stream for the subscriber, and
    # echoes and TCP are not what loss tests measure. The sequence is recorded before counting,
    # so a full set (1,048,576 entries) stops the rule at once instead of dropping unrecorded.
    # nft refuses "numgen random mod 100 < 100": at 100 % there is no draw at all.
    local chance=(numgen random mod 100 "<" "$percent")
    [ "$percent" -eq 100 ] && chance=()
    ip netns exec "$ns" nft add rule inet mdrelay "loss_$line" \
        @th,64,32 0x4d445255 @th,112,8 0 "${chance[@]}" \
        add "@dropped_$line" "{ @th,192,64 }" counter name "drops_$line" drop
}

# Packets a line's counter has counted (the route's, with the prefix "route_").
drops() {
    ip netns exec "$1" nft list counter inet mdrelay "${3-}drops_$2" | awk '$1 == "packets" { print $2 }'
}

cmd_counter() {
    [ $# -eq 1 ] || bad "counter needs a host"
    check_host "$1"
    need_root counter
    local ns
    ns=$(host_ns "$1")
    echo "a=$(drops "$ns" a) b=$(drops "$ns" b)"
}

cmd_dropped() {
    [ $# -eq 2 ] || bad "dropped needs a host and a line"
    check_host "$1"
    check_line "$2"
    need_root dropped
    local ns token h
    ns=$(host_ns "$1")
    # nft reads the 8 sequence bytes as one big-endian number; the relay writes them
    # little-endian: swap the bytes back, then print in decimal (printf %u covers all of u64).
    ip netns exec "$ns" nft list set inet mdrelay "dropped_$2" |
        awk '/elements = \{/ { on = 1 } on { gsub(/[{},=]/, " "); for (i = 1; i <= NF; i++) if ($i ~ /^0x[0-9a-f]+$/) print $i }' |
        while read -r token; do
            h=${token#0x}
            while [ ${#h} -lt 16 ]; do h=0$h; done
            printf '%u\n' "0x${h:14:2}${h:12:2}${h:10:2}${h:8:2}${h:6:2}${h:4:2}${h:2:2}${h:0:2}"
        done | sort -n
}

cmd_link() {
    [ $# -eq 3 ] || bad "link needs a host, a line and up or down"
    check_host "$1"
    check_line "$2"
    case $3 in up | down) ;; *) bad "link: \"$3\" is neither up nor down" ;; esac
    need_root link
    local ns
    ns=$(host_ns "$1")
    ip -n "$ns" link set "${2}0" "$3"
    # Taking an interface down deletes the routes through it; the subnet's comes back with the
    # address, the multicast route has to be put back.
    if [ "$3" = up ] && [ "$2" = a ]; then
        ip -n "$ns" route replace "$MCAST_RANGE" dev a0
    fi
}

# NATS's ports on every host: clients, and the cluster's routes.
readonly NATS_CLIENT_PORT=4222
readonly NATS_ROUTE_PORT=6222

# The nats-server binary: on PATH, else where .ci/nats.sh caches it.
nats_server_bin() {
    local cached="${MDRELAY_TOOLS:-$HOME/.cache/mdrelay-tools}/bin/nats-server"
    if command -v nats-server >/dev/null; then
        command -v nats-server
    elif [ -x "$cached" ]; then
        echo "$cached"
    else
        die "nats-server is not on PATH nor in ${cached%/*}: install it with \"bash .ci/nats.sh\""
    fi
}

# Waits up to 30 s for FILE to contain TEXT.
wait_for_log() {
    local file=$1 text=$2
    for _ in $(seq 300); do
        grep -q -- "$text" "$file" 2>/dev/null && return 0
        sleep 0.1
    done
    return 1
}

cmd_nats_up() {
    [ $# -eq 1 ] || bad "nats-up needs a directory for the servers' stores, logs and pids"
    need_root nats-up
    local dir=$1 server host ns addr routes=() joined
    server=$(nats_server_bin)
    mkdir -p "$dir"
    for host in "${HOSTS[@]}"; do
        routes+=("nats://$(address "$host" a):$NATS_ROUTE_PORT")
    done
    joined=$(IFS=,; echo "${routes[*]}")
    for host in "${HOSTS[@]}"; do
        ns=$(host_ns "$host")
        addr=$(address "$host" a)
        [ -f "$dir/$host.pid" ] && die "nats-up: $dir/$host.pid exists: run \"$prog nats-down $dir\" first"
        rm -f "$dir/$host.log"
        # `ip netns exec` execs the server, so $! is the server's own pid.
        ip netns exec "$ns" "$server" --jetstream --store_dir "$dir/$host" --addr "$addr" --port "$NATS_CLIENT_PORT" \
            --server_name "$prefix-$host" --cluster_name "$prefix" --cluster "nats://$addr:$NATS_ROUTE_PORT" \
            --routes "$joined" </dev/null >"$dir/$host.log" 2>&1 &
        echo $! >"$dir/$host.pid"
    done
    for host in "${HOSTS[@]}"; do
        wait_for_log "$dir/$host.log" "Server is ready" ||
            die "nats-up: the server on $host is not ready after 30 s (see $dir/$host.log)"
    done
    local leader=0
    for _ in $(seq 300); do
        if grep -q "metadata leader" "$dir"/*.log 2>/dev/null; then leader=1 && break; fi
        sleep 0.1
    done
    [ "$leader" = 1 ] || die "nats-up: JetStream has no metadata leader after 30 s (see $dir/*.log)"
    echo "$prog: nats-up: servers on ${HOSTS[*]} at nats://198.18.0.N:$NATS_CLIENT_PORT, clustered over line A" >&2
}

cmd_nats_down() {
    [ $# -eq 1 ] || bad "nats-down needs the directory given to nats-up"
    need_root nats-down
    local dir=$1 host pid
    for host in "${HOSTS[@]}"; do
        [ -f "$dir/$host.pid" ] || continue
        pid=$(cat "$dir/$host.pid")
        kill -TERM "$pid" 2>/dev/null || true
        for _ in $(seq 50); do
            kill -0 "$pid" 2>/dev/null || break
            sleep 0.1
        done
        kill -KILL "$pid" 2>/dev/null || true
        rm -f "$dir/$host.pid"
    done
}

cmd_nats_loss() {
    [ $# -eq 3 ] || bad "nats-loss needs a host, a percentage and the peer whose segments are dropped"
    local host=$1 percent=$2 peer=$3
    check_host "$host"
    check_host "$peer"
    [ "$host" != "$peer" ] || bad "nats-loss: a host has no route to itself"
    if ! [[ $percent =~ ^[0-9]{1,3}$ ]] || [ $((10#$percent)) -gt 100 ]; then
        bad "nats-loss: \"$percent\" is not a whole percentage from 0 to 100"
    fi
    percent=$((10#$percent))
    need_root nats-loss
    local ns from
    ns=$(host_ns "$host")
    from=$(address "$peer" a)
    # One peer's rules are replaced; the others' stay.
    local handle
    for handle in $(ip netns exec "$ns" nft -a list chain inet mdrelay route_loss_a |
        awk -v from="$from" '$0 ~ "saddr " from " " { print $NF }'); do
        ip netns exec "$ns" nft delete rule inet mdrelay route_loss_a handle "$handle"
    done
    [ "$percent" -eq 0 ] && return
    local chance=(numgen random mod 100 "<" "$percent")
    [ "$percent" -eq 100 ] && chance=()
    # Either end of a route may have opened it: the route port is the source or the destination.
    local port
    for port in sport dport; do
        ip netns exec "$ns" nft add rule inet mdrelay route_loss_a \
            ip saddr "$from" tcp "$port" "$NATS_ROUTE_PORT" "${chance[@]}" counter name route_drops_a drop
    done
}

cmd_nats_counter() {
    [ $# -eq 1 ] || bad "nats-counter needs a host"
    check_host "$1"
    need_root nats-counter
    local ns
    ns=$(host_ns "$1")
    echo "a=$(drops "$ns" a route_) b=$(drops "$ns" b route_)"
}

cmd_status() {
    [ $# -eq 0 ] || bad "status takes no arguments"
    need_root status
    if ! ns_exists "$NET"; then
        echo "network $prefix: down"
        return
    fi
    echo "network $prefix: switch $NET (bridges br-a, br-b)"
    local host ns line state percent out
    for host in "${HOSTS[@]}"; do
        ns=$(ns_of "$host")
        if ! ns_exists "$ns"; then
            echo "  $host: missing ($ns)"
            continue
        fi
        out="  $host ($ns):"
        for line in "${LINES[@]}"; do
            state=$(ip -n "$ns" -br link show "${line}0" 2>/dev/null | awk '{ print $2 }')
            percent=$(ip netns exec "$ns" nft list chain inet mdrelay "loss_$line" 2>/dev/null |
                sed -n -e 's/.*numgen random mod 100 < \([0-9]*\).*/\1/p' -e '/numgen/b' -e 's/.* drop$/100/p')
            out+=" ${line}0 $(address "$host" "$line") ${state:-?} loss ${percent:-0}% dropped $(drops "$ns" "$line");"
        done
        echo "${out%;}"
    done
}

[ $# -ge 1 ] || usage
command=$1
shift
case $command in
    up) [ $# -eq 0 ] || bad "up takes no arguments"; cmd_up ;;
    down) [ $# -eq 0 ] || bad "down takes no arguments"; cmd_down ;;
    exec) cmd_exec "$@" ;;
    loss) cmd_loss "$@" ;;
    counter) cmd_counter "$@" ;;
    dropped) cmd_dropped "$@" ;;
    link) cmd_link "$@" ;;
    status) cmd_status "$@" ;;
    nats-up) cmd_nats_up "$@" ;;
    nats-down) cmd_nats_down "$@" ;;
    nats-loss) cmd_nats_loss "$@" ;;
    nats-counter) cmd_nats_counter "$@" ;;
    -h | --help | help) usage ;;
    *) bad "unknown command \"$command\"" ;;
esac
