import "reflect-metadata";
import { NestFactory } from "@nestjs/core";

import { AppModule } from "./app.module.js";

// No HTTP server needed: the sweeps are background workers.
const app = await NestFactory.createApplicationContext(AppModule, { logger: ["error", "warn"] });
app.enableShutdownHooks();
