#!/usr/bin/env node
// Test helper: replays event streams (one JSON case per stdin line, the spec's end-to-end format) through the
// W3C Attribution reference backend built by w3c-attribution/build.sh into DEST, and prints after every
// measureConversion the backend's per-site privacy budget store and epoch start time (what tools/events.js
// does not show), so that araopt's model can be compared store for store.
//   node w3c_budget_runner.js DEST < cases.jsonl
"use strict";
const fs = require("fs");
const path = require("path");
const dest = process.argv[2];
const { Backend, days } = require(path.join(dest, "src/ts/dist/src/backend.js"));
const { Temporal } = require(path.join(dest, "src/ts/node_modules/temporal-polyfill"));
const defaults = JSON.parse(fs.readFileSync(path.join(dest, "src/ts/e2e-tests/CONFIG.json"), "utf8"));

function run(tc, index, out) {
  const c = Object.assign({}, defaults, tc.config || {});
  let now = new Temporal.Instant(0n);
  const b = new Backend({
    aggregationServices: new Map(Object.entries(c.aggregationServices).map(([u, p]) => [u, { protocol: p }])),
    includeUnencryptedHistogram: true,
    globalPrivacyBudgetPerEpoch: c.globalPrivacyBudgetPerEpoch,
    impressionSiteQuotaPerEpoch: c.impressionSiteQuotaPerEpoch,
    maxConversionSitesPerImpression: c.maxConversionSitesPerImpression,
    maxConversionCallersPerImpression: c.maxConversionCallersPerImpression,
    maxImpressionSitesForConversion: c.maxImpressionSitesForConversion,
    maxImpressionCallersForConversion: c.maxImpressionCallersForConversion,
    maxCreditSize: c.maxCreditSize, maxMatchValues: c.maxMatchValues, maxLookbackDays: c.maxLookbackDays,
    maxHistogramSize: c.maxHistogramSize, perSitePrivacyBudget: c.perSitePrivacyBudget,
    privacyBudgetEpoch: days(c.privacyBudgetEpochDays),
    now: () => now,
    fairlyAllocateCreditFraction: () => c.fairlyAllocateCreditFraction,
    epochStart: () => c.epochStart,
  });
  for (const ev of tc.events) {
    now = Temporal.Instant.fromEpochMilliseconds(Math.round(ev.seconds * 1e3));
    let row = null;
    switch (ev.event) {
      case "saveImpression": try { b.saveImpression(ev.site, ev.intermediarySite, ev.options); } catch (e) { row = { error: e.name }; } break;
      case "measureConversion":
        try { row = { histogram: b.measureConversion(ev.site, ev.intermediarySite, ev.options).unencryptedHistogram }; }
        catch (e) { row = { error: e.name }; }
        break;
      case "clearImpressionsForSite": b.clearImpressionsForSite(ev.site); break;
      case "clearBrowsingHistoryForAttribution": b.clearState(ev.sites, ev.forgetVisits); break;
      case "enableAPI": b.enabled = true; break;
      case "disableAPI": b.enabled = false; break;
    }
    if (row !== null) {
      row.case = index; row.seconds = ev.seconds; row.event = ev.event;
      row.budget = b.privacyBudgetEntries.map((e) => [e.epoch, e.site, e.value]);
      row.epochStart = b.epochStartTime === null ? null : b.epochStartTime.epochMilliseconds;
      out.push(JSON.stringify(row));
    }
  }
}

const out = [];
fs.readFileSync(0, "utf8").split("\n").filter((l) => l.trim()).forEach((l, i) => run(JSON.parse(l), i, out));
process.stdout.write(out.join("\n") + (out.length ? "\n" : ""));
