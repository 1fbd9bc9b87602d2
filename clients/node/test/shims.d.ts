// express 4, installed beside express 5 as the "express4" alias (npm:express@4), typed as 5.
declare module "express4" {
  import express from "express";
  export default express;
}
