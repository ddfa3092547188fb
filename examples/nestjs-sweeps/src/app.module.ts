import { Logger, Module } from "@nestjs/common";
import { ScheduleModule } from "@nestjs/schedule";
import { LeaseholdModule } from "@leasehold/client/nestjs";

import { config } from "./config.js";
import { Sweeps } from "./workers.js";

const logger = new Logger("Sweeps");

@Module({
  imports: [
    ScheduleModule.forRoot(),
    // The sidecar beside this replica: $LEASEHOLD_SIDECAR, default http://127.0.0.1:7070; this
    // replica's id in `leasehold status`: $LEASEHOLD_INSTANCE, else host name and pid.
    LeaseholdModule.forRoot({
      onSidecarDown: config.onSidecarDown,
      ttlMs: config.ttlMs,
      onResult: (task, result) => {
        if (result === "failed" || result === "sidecar-down" || config.logTicks) logger.warn(`${task}: ${result}`);
      },
    }),
  ],
  providers: [Sweeps],
})
export class AppModule {}
