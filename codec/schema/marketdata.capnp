# mdrelay's Cap'n Proto schema: one Batch per frame, the messages of one IEX-TP segment.
#
# Frames use Cap'n Proto's standard stream framing (segment table, then the segments), unpacked or
# packed. The Rust code in codec/generated/capnp/ is generated from this file by
# codec/schema/gen-capnp.sh; regenerate it after any change here.
#
# Layout choices, made for speed and size (the byte offsets are what `capnp compile -ocapnp`
# prints for this file):
# - A message is one fixed-size struct, and the list of messages is a single inline-composite
#   list: reading message i is an index computation, with no pointer to follow. Each message type
#   is a group, Cap'n Proto's inline struct, inside one union, rather than a pointer to a separate
#   struct per type: a pointer per message would cost a word, an allocation when building and a
#   bounds-checked pointer traversal when reading, for every message.
# - The fields every type has (timestamp, symbol) come first and outside the union, so a reader
#   gets them without knowing the type. The first union member is the smallest (one byte), which
#   makes the compiler place the union tag in word 2 beside the one-byte flag every type has;
#   after it, every type lays out the same way: flag at byte 16, tag at 18, a 32-bit size at 20,
#   prices from word 3. Trade reports fill 5 data words, price level updates 4, quote updates
#   (the largest inline type) 6; a message is 6 data words and 1 pointer, 56 bytes. The unused
#   words of smaller types are at the end of the struct, next to the pointer, so packing turns
#   them into one run of zero words (2 bytes).
# - Auction information would need 11 data words inline and make every message nearly twice as
#   large; it is rare (a few hundred a day), so it is a pointer to its own struct. Unknown
#   messages, also rare, share that pointer slot as Data.
# - The 8-byte symbol is a UInt64 (its bytes, space-padded as IEX sends them, little-endian), not
#   Data: it is read and written as one word inside the message struct, where Data would add a
#   pointer and an 8-byte object per message. Its bytes are kept as they are: a timestamp and a
#   symbol without zero bytes are adjacent words that packing copies as one run under one tag,
#   and every tag is a step the reader cannot take before the previous one (XORing the padding
#   to zeros would save about 4 bytes a message packed, and cost a tag).
# - Prices are Int64 in IEX's fixed point (4 implied decimals), sizes UInt32, timestamps Int64 ns
#   since the Unix epoch, flags and codes UInt8: the IEX values as they are, so no conversion can
#   lose anything.
#
# codec/src/capnproto/mod.rs reads trade reports and price level updates at the offsets above,
# straight from the message's data section; its tests check them against the generated accessors,
# so a change here that moves them fails there.

@0x8fc9f1fde08a9dfb;

# capnpc-rust's parentModule annotation (rust.capnp in the capnpc crate declares it with this
# id). The generated code names its own types by absolute paths, and it is included as
# `crate::capnproto::marketdata_capnp`. Declared here rather than imported so that
# generating needs no import path into the plugin's sources.
annotation parentModule @0xabee386cd1450364 (file) :Text;
$parentModule("capnproto");

# One frame: the header of an IEX-TP segment, the publisher's send time and the segment's messages.
struct Batch {
  firstSequence @0 :Int64;
  # Sequence number of the first message (of the next one, for an empty batch).

  sendTime @1 :Int64;
  # IEX send time of the segment, ns since the Unix epoch.

  publishTime @2 :Int64;
  # The publisher's send time, ns since the Unix epoch, for latency.

  channelId @3 :UInt32;
  # IEX channel id.

  sessionId @4 :UInt32;
  # IEX session id.

  protocolId @5 :UInt16;
  # IEX message protocol id: 0x8003 TOPS, 0x8004 DEEP.

  messages @6 :List(Message);
  # In feed order; the message count is the list's length.
}

# One IEX message. The union tag says the type; every type's one-byte flag or code is at byte 16.
struct Message {
  timestamp @0 :Int64;
  # ns since the Unix epoch (unused by `unknown`).

  symbol @1 :UInt64;
  # The 8 symbol bytes, space-padded as IEX sends them, little-endian (unused by `systemEvent`
  # and `unknown`).

  union {
    systemEvent :group {
      # S.
      event @2 :UInt8;
    }
    securityDirectory :group {
      # D.
      flags @3 :UInt8;
      roundLotSize @4 :UInt32;
      adjustedPocPrice @5 :Int64;
      luldTier @6 :UInt8;
    }
    tradingStatus :group {
      # H.
      status @7 :UInt8;
      reason @8 :UInt32;
      # The four ASCII reason bytes, little-endian.
    }
    retailLiquidityIndicator :group {
      # I.
      indicator @9 :UInt8;
    }
    operationalHaltStatus :group {
      # O.
      status @10 :UInt8;
    }
    shortSalePriceTestStatus :group {
      # P.
      inEffect @11 :UInt8;
      detail @12 :UInt8;
    }
    securityEvent :group {
      # E.
      event @13 :UInt8;
    }
    priceLevelBuy :group {
      # 8: the side is the union tag, as it is the type byte in IEX.
      eventFlags @14 :UInt8;
      size @15 :UInt32;
      price @16 :Int64;
    }
    priceLevelSell :group {
      # 5.
      eventFlags @17 :UInt8;
      size @18 :UInt32;
      price @19 :Int64;
    }
    quoteUpdate :group {
      # Q.
      flags @20 :UInt8;
      bidSize @21 :UInt32;
      bidPrice @22 :Int64;
      askPrice @23 :Int64;
      askSize @24 :UInt32;
    }
    tradeReport :group {
      # T.
      saleCondition @25 :UInt8;
      size @26 :UInt32;
      price @27 :Int64;
      tradeId @28 :Int64;
    }
    tradeBreak :group {
      # B: the same fields as the trade it breaks.
      saleCondition @29 :UInt8;
      size @30 :UInt32;
      price @31 :Int64;
      tradeId @32 :Int64;
    }
    officialPrice :group {
      # X.
      priceType @33 :UInt8;
      price @34 :Int64;
    }
    auctionInformation @35 :AuctionInformation;
    # A: out of line, see the layout notes at the top.

    unknown @36 :Data;
    # A type the model does not know: the whole IEX message, type byte first (1 to 65535 bytes).
  }
}

# A: auction information (timestamp and symbol are in the Message).
struct AuctionInformation {
  auctionType @0 :UInt8;
  imbalanceSide @1 :UInt8;
  extensionNumber @2 :UInt8;
  pairedShares @3 :UInt32;
  referencePrice @4 :Int64;
  indicativeClearingPrice @5 :Int64;
  imbalanceShares @6 :UInt32;
  scheduledAuctionTime @7 :UInt32;
  # Seconds since the Unix epoch.
  auctionBookClearingPrice @8 :Int64;
  collarReferencePrice @9 :Int64;
  lowerAuctionCollar @10 :Int64;
  upperAuctionCollar @11 :Int64;
}
