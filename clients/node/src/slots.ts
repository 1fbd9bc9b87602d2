// Cluster slots: CRC16 of a key's hash tag, and the grouping of checkAll's keys by slot.
// Mirrors clients/go/slots.go.

/** A key's Redis Cluster slot: CRC16 (XMODEM) of its hash tag (or the whole key), mod 16384. */
export function keySlot(key: string): number {
  let bytes = Buffer.from(key, "utf8");
  const open = bytes.indexOf(0x7b);
  if (open >= 0) {
    const close = bytes.indexOf(0x7d, open + 1);
    if (close > open + 1) bytes = bytes.subarray(open + 1, close);
  }
  let crc = 0;
  for (const b of bytes) {
    crc ^= b << 8;
    for (let i = 0; i < 8; i++) crc = crc & 0x8000 ? ((crc << 1) ^ 0x1021) & 0xffff : (crc << 1) & 0xffff;
  }
  return crc % 16384;
}

/** Groups entry indexes by slot, in the order each slot first appears. */
export function slotGroups(keys: readonly string[]): number[][] {
  const groups: number[][] = [];
  const at = new Map<number, number>();
  keys.forEach((k, i) => {
    const s = keySlot(k);
    let g = at.get(s);
    if (g === undefined) {
      g = groups.length;
      at.set(s, g);
      groups.push([]);
    }
    groups[g]!.push(i);
  });
  return groups;
}
